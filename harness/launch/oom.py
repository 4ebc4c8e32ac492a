"""Whether the kernel's OOM killer struck during this run: a rank it ends reads "killed by
SIGKILL", the same as any SIGKILL, with no word of memory. The evidence is the memory cgroup's
``oom_kill`` counter (cgroup v2 ``memory.events``, v1 ``memory.oom_control``), read when this
module is first imported (the run's start) and again when a rank is found killed: a count that
grew means processes of this run's cgroup were killed for memory since the run started.
"""

from __future__ import annotations

import re
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_COUNT = re.compile(r"^oom_kill (\d+)$", re.M)


def _candidates(root: Path, proc_cgroup: str) -> list[Path]:
    """The counter files to try, this process's own cgroup first, then the mount's root
    (inside a container the root is the container's cgroup)."""
    out = []
    for line in proc_cgroup.splitlines():
        hier, _, rest = line.partition(":")
        ctrl, _, path = rest.partition(":")
        if hier == "0" and ctrl == "":
            out.append(root / path.lstrip("/") / "memory.events")
        elif "memory" in ctrl.split(","):
            out.append(root / "memory" / path.lstrip("/") / "memory.oom_control")
    return out + [root / "memory.events", root / "memory" / "memory.oom_control"]


def oom_kills(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> int | None:
    """The first readable ``oom_kill`` counter; None where there is none."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            proc_cgroup = ""
    for path in _candidates(root, proc_cgroup):
        try:
            m = _COUNT.search(path.read_text())
        except OSError:
            continue
        if m:
            return int(m.group(1))
    return None


AT_START = oom_kills()


def explain(text: str, before: int | None = AT_START, now: int | None = None) -> str:
    """``text`` (how ranks ended) with the memory named where a SIGKILL met OOM kills."""
    if "SIGKILL" not in text or before is None:
        return text
    now = oom_kills() if now is None else now
    if now is None or now <= before:
        return text
    return (f"{text} -- out of memory: the kernel's OOM killer ended {now - before} process(es) "
            f"of this run's memory cgroup since the run started (oom_kill {before} -> {now}); "
            f"give the ranks more memory or run fewer launches at once (--launches-per-gpu)")
