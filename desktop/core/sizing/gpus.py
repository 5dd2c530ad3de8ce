"""GPU types: memory, compute, interconnect and a typical price, from ``resources/gpus.json``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB_TO_GB = 1.073741824
# Memory PyTorch can actually use: the driver and the CUDA runtime keep a little of what the card reports.
USABLE_FRACTION = 0.97


@dataclass(frozen=True)
class GpuSpec:
    """One GPU type.

    Attributes:
        id: Short identifier (``h100-sxm``).
        name: Display name.
        vram_gib: Memory the driver reports, GiB.
        bf16_tflops: Dense bf16 tensor-core peak.
        interconnect: ``nvlink``, ``pcie`` or ``infinity-fabric`` (multi-GPU scaling depends on it).
        list_price_usd_per_h: A typical on-demand price per GPU-hour; live offers replace it.
        mfu: Achievable model-FLOPs utilisation for a PEFT fine-tune.
        aliases: Other names accepted by ``--gpu``.
        inter_node: The network between machines of a multi-node offer: ``infiniband`` or ``ethernet``.
        inter_node_gbps: Its bandwidth per machine (shared by the machine's GPUs), Gb/s.
    """

    id: str
    name: str
    vram_gib: float
    bf16_tflops: float
    interconnect: str
    list_price_usd_per_h: float
    mfu: float
    aliases: tuple[str, ...] = ()
    inter_node: str = "ethernet"
    inter_node_gbps: float = 25.0

    @property
    def usable_gb(self) -> float:
        """Memory available to training, in decimal GB (comparable with the estimate's ``per_gpu_total``)."""
        return self.vram_gib * GIB_TO_GB * USABLE_FRACTION

    @property
    def fast_interconnect(self) -> bool:
        """Whether cards talk over NVLink-class links (sharding scales well)."""
        return self.interconnect != "pcie"


def gpus_from_json(data: Mapping[str, Any]) -> list[GpuSpec]:
    """Builds the GPU list from the decoded ``gpus.json``."""
    return [
        GpuSpec(
            id=raw["id"],
            name=raw["name"],
            vram_gib=float(raw["vram_gib"]),
            bf16_tflops=float(raw["bf16_tflops"]),
            interconnect=raw["interconnect"],
            list_price_usd_per_h=float(raw["list_price_usd_per_h"]),
            mfu=float(raw["mfu"]),
            aliases=tuple(raw.get("aliases", ())),
            inter_node=raw["inter_node"],
            inter_node_gbps=float(raw["inter_node_gbps"]),
        )
        for raw in data["gpus"]
    ]


def find_gpu(gpus: list[GpuSpec], name: str) -> GpuSpec | None:
    """Finds a GPU by id, display name or alias, ignoring case, spaces and dashes."""
    key = name.lower().replace(" ", "").replace("-", "").replace("nvidia", "")
    for gpu in gpus:
        names = (gpu.id, gpu.name, *gpu.aliases)
        if any(key == n.lower().replace(" ", "").replace("-", "") for n in names):
            return gpu
    return None
