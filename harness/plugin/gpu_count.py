"""How many GPUs the driver sees, asked of NVML (``libnvidia-ml``): no torch, no CUDA context."""

from __future__ import annotations

import ctypes


def nvml_device_count() -> int | None:
    """The GPUs the driver's own library (``libnvidia-ml``) sees, or None where it cannot say.
    Milliseconds, and neither torch nor a CUDA context in the asking process: pytest counts
    the GPUs before its first launch starts, and importing torch and initializing CUDA for that
    would delay every GPU run's first launch by seconds."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint(0)
        return count.value if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else None
    finally:
        nvml.nvmlShutdown()
