"""Is the GPU memory a launch held free again? A rank that outlived its launch keeps its
context and memory, and every later launch on that GPU runs short or hangs: after a kill the
launcher waits (bounded) until none of its pids is in ``nvidia-smi
--query-compute-apps=pid,used_memory`` and records those that still are. Without nvidia-smi
(or with host pids in a container) it reports nothing; CPU runs never ask.
"""

from __future__ import annotations

import shutil
import subprocess
import time

QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
SMI_TIMEOUT_S = 10.0


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
