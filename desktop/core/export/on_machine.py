"""Export here or on the machine: whether merging fits this computer, and what making it on the rented one costs.

Merging an adapter loads the base model in 16 bits (float32 when there is room) beside the adapter; the local export
then writes the merged folder, an F16 GGUF to quantise from, and the quantised file, after a Hub base's download.
When that does not fit this computer's memory or disk, the machine that trained the adapter (it has the base already)
can make the merged model and a GGUF before it is let go: :data:`ON_MACHINE_OUTPUTS`, paid for the machine's minutes
of work and of download.
"""

from __future__ import annotations

from dataclasses import dataclass

from desktop.core.units import bytes_memory_text, count_text

#: What the review proposes to make on the machine: the merged model and a Q8_0 GGUF (the converter writes it alone).
ON_MACHINE_OUTPUTS = ("merged", "gguf:Q8_0")
#: Memory a 16-bit merge takes, per byte of 16-bit weights: the weights, the adapter, the probe's logits, Python.
MERGE_MEMORY_FACTOR = 1.25
#: Disk the default local export takes, per byte of 16-bit weights: merged folder, F16 GGUF, Q4_K_M, MLX 4-bit.
LOCAL_EXPORT_DISK_FACTOR = 2.0 * 2 + 0.6 + 0.3
#: Bytes per 16-bit byte of each on-machine output.
OUTPUT_SIZE_FACTOR = {"merged": 1.0, "gguf:F16": 1.0, "gguf:BF16": 1.0, "gguf:Q8_0": 0.53}
#: The machine's disk and CPU pace for loading, merging, saving and converting (bytes per second).
MACHINE_BYTES_PER_S = 0.8e9
#: Minutes the export takes beyond moving bytes (starting Python, loading torch, the logit check).
MACHINE_FIXED_MINUTES = 2.0
#: This computer's download pace assumed for the outputs (megabytes per second): a 400 Mbit/s line.
HOME_MB_PER_S = 50.0


@dataclass(frozen=True)
class HomeRoom:
    """What this computer has for a local export: its memory, and the free disk where exports are written."""

    memory_bytes: int | None
    free_disk_bytes: int | None


@dataclass(frozen=True)
class OnMachineCost:
    """The paid time of an export on the machine: its work there and the download home, and their price."""

    work_minutes: float
    download_minutes: float
    usd: float | None

    @property
    def minutes(self) -> float:
        """Paid minutes in all."""
        return self.work_minutes + self.download_minutes


def merge_memory_bytes(params: int) -> int:
    """Memory a local 16-bit merge of a model of ``params`` parameters needs."""
    return int(params * 2 * MERGE_MEMORY_FACTOR)


def local_export_disk_bytes(params: int, base_from_hub: bool) -> int:
    """Free disk the default local export needs (plus the base's download when it comes from the Hub)."""
    return int(params * 2 * (LOCAL_EXPORT_DISK_FACTOR + (1.0 if base_from_hub else 0.0)))


def why_on_machine(params: int, room: HomeRoom, base_from_hub: bool) -> str | None:
    """Why the merge does not fit this computer (its memory, else its disk), or None when it fits or is unknown."""
    memory = merge_memory_bytes(params)
    if room.memory_bytes is not None and memory > room.memory_bytes:
        return (
            f"merging this {count_text(params)} model needs about {bytes_memory_text(memory)} of memory, and this "
            f"computer has {bytes_memory_text(room.memory_bytes)}"
        )
    disk = local_export_disk_bytes(params, base_from_hub)
    if room.free_disk_bytes is not None and disk > room.free_disk_bytes:
        return (
            f"exporting this {count_text(params)} model here needs about {disk / 1e9:.0f} GB of free disk, and this "
            f"computer has {room.free_disk_bytes / 1e9:.0f} GB free"
        )
    return None


def on_machine_cost(
    params: int, outputs: tuple[str, ...], price_per_hour: float | None, home_mb_per_s: float = HOME_MB_PER_S
) -> OnMachineCost:
    """The machine's paid minutes for ``outputs`` (its work, then the download home) and their price."""
    weights = params * 2
    made = sum(OUTPUT_SIZE_FACTOR.get(output, 1.0) for output in outputs) * weights
    moved = weights * 2 + made * 2  # the base read and the merge saved, then each output written and hashed
    work = MACHINE_FIXED_MINUTES + moved / MACHINE_BYTES_PER_S / 60
    download = made / (home_mb_per_s * 1e6) / 60
    usd = round((work + download) / 60 * price_per_hour, 2) if price_per_hour else None
    return OnMachineCost(round(work, 1), round(download, 1), usd)


def outputs_words(outputs: tuple[str, ...]) -> str:
    """``the merged model and a Q8_0 GGUF`` for the outputs asked for."""
    words = ["the merged model" if o == "merged" else f"a {o.removeprefix('gguf:')} GGUF" for o in outputs]
    return " and ".join(words) if len(words) < 3 else ", ".join(words[:-1]) + f" and {words[-1]}"
