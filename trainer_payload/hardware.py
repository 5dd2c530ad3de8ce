"""What the training process runs on: device, precision, and GPU memory/utilisation readings."""

from __future__ import annotations

from typing import Any


def cuda_available() -> bool:
    """Whether a CUDA GPU is usable."""
    import torch

    return bool(torch.cuda.is_available())


def use_bf16() -> bool:
    """bf16 where the GPU supports it; fp32 on CPU and older GPUs."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def gpu_readings() -> dict[str, Any]:
    """Peak allocated/reserved GB and utilisation of GPU 0 (empty on CPU)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    readings: dict[str, Any] = {
        "gpu_mem_allocated_gb": round(torch.cuda.max_memory_allocated() / 1e9, 3),
        "gpu_mem_reserved_gb": round(torch.cuda.max_memory_reserved() / 1e9, 3),
    }
    try:
        readings["gpu_util"] = torch.cuda.utilization()
    except Exception:  # noqa: BLE001 - pynvml missing or the driver refuses: utilisation is optional
        readings["gpu_util"] = None
    return readings


def peak_memory_gb() -> float | None:
    """Peak allocated GPU memory so far, or ``None`` on CPU."""
    import torch

    return round(torch.cuda.max_memory_allocated() / 1e9, 3) if torch.cuda.is_available() else None
