"""This computer as a trial sees it: Apple Silicon or not, an NVIDIA GPU's memory, its memory and CPUs."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess

from desktop.core.runs.trial import Machine

#: Seconds ``nvidia-smi`` may take to answer.
_SMI_TIMEOUT = 10


def this_machine() -> Machine:
    """This computer (blocking: asks ``nvidia-smi`` for the GPU's memory when there is one)."""
    apple = platform.system() == "Darwin" and platform.machine() == "arm64"
    return Machine(apple, 0.0 if apple else nvidia_gpu_gb(), memory_gb(), os.cpu_count() or 1)


def memory_gb() -> float:
    """This computer's memory in GB (8 when the platform does not say: a modest guess)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf
        return _windows_memory_gb() or 8.0


def _windows_memory_gb() -> float | None:
    try:
        import ctypes

        class _Status(ctypes.Structure):
            _fields_ = [("length", ctypes.c_ulong), ("load", ctypes.c_ulong), ("total", ctypes.c_ulonglong)]
            _fields_ += [(name, ctypes.c_ulonglong) for name in ("free", "pf", "pf_free", "virt", "virt_free", "x")]

        status = _Status()
        status.length = ctypes.sizeof(_Status)
        if ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):  # type: ignore[attr-defined]
            return float(status.total) / 1e9
    except (AttributeError, OSError):
        pass
    return None


def nvidia_gpu_gb() -> float:
    """The first NVIDIA GPU's memory in GB, 0 without one (or without its driver's ``nvidia-smi``)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0.0
    try:
        answer = subprocess.run(
            [smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=_SMI_TIMEOUT,
            check=True,
        )
        return float(answer.stdout.split()[0]) * 1.048576 / 1000  # MiB to GB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return 0.0
