"""How many GPUs are there (NVML), and is the GPU memory a launch held free again?
(``nvidia-smi``, bounded; CPU runs never ask.)

A rank that outlives its launch keeps its CUDA context, memory and NCCL communicators: every
later launch on that GPU then runs short of memory or hangs. After killing a launch the
launcher waits (bounded) until none of its pids appears in
``nvidia-smi --query-compute-apps=pid,used_memory``, and records the ones that still do.

Import-safe everywhere: nothing runs at import, and without ``nvidia-smi`` the check reports
nothing. Inside a container with its own PID namespace nvidia-smi may list host pids; those
never match the launch's pids, so the check then cannot see a leak (the process scan of
harness/procs.py still does).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import time

QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
SMI_TIMEOUT_S = 10.0


def nvml_device_count() -> int | None:
    """The GPUs the driver's own library (``libnvidia-ml``) sees, or None where it cannot say.
    Milliseconds, and neither torch nor a CUDA context in the asking process: pytest counts
    the GPUs before its first launch starts, and importing torch and initializing CUDA for that
    put ~2 s before every GPU run's first launch (1x H200, reports/bench/README.md)."""
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


def parse_compute_apps(text: str) -> dict[int, int]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits``
    output -> {pid: MiB} (one GPU's line per pid and GPU; summed over GPUs)."""
    out: dict[int, int] = {}
    for line in text.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        try:
            mib = int(float(parts[1]))
        except ValueError:
            mib = 0  # "[N/A]" (no permission to read the usage): still holds the GPU
        out[int(parts[0])] = out.get(int(parts[0]), 0) + mib
    return out


def compute_apps(smi: str | None = None) -> dict[int, int] | None:
    """{pid: MiB} of the processes holding GPU memory, or None when nvidia-smi is missing or
    fails."""
    smi = smi or shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, *QUERY], capture_output=True, text=True,
                             timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_compute_apps(out.stdout) if out.returncode == 0 else None


def wait_released(pids, timeout_s: float = 30.0, poll_s: float = 0.5, query=compute_apps
                  ) -> list[str]:
    """Wait until none of ``pids`` holds GPU memory; returns "pid P holds N MiB" for those that
    still do after ``timeout_s`` (empty when released, or when nvidia-smi cannot tell)."""
    pids = set(pids)
    deadline = time.monotonic() + timeout_s
    while True:
        apps = query()
        if apps is None:
            return []
        held = {p: m for p, m in apps.items() if p in pids}
        if not held:
            return []
        if time.monotonic() >= deadline:
            return [f"pid {p} holds {m} MiB" for p, m in sorted(held.items())]
        time.sleep(poll_s)
