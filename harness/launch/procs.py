"""The processes of a launch: tag them, find them, kill them, and prove they are gone.

torchrun starts each rank in a session of its own, ranks start DCP's stager processes, and a
killed parent leaves its children to init. So every process of a launch carries
``HARNESS_LAUNCH_ID=<tag>`` in its environment and :func:`kill_tagged` finds them all in
``/proc``, kills each and its group, and waits (bounded) until none is left. The second line of
defence is ``worker.tether``. Linux only; elsewhere the scans find nothing.

A pid names a process only until it is gone (the kernel hands the number on), so a process
found once and killed later is named by pid and start time (``identities``): a kill pins it with
a pidfd, checks it, signals through the pidfd. A session or parent found by pid counts only
while that pid is the recorded process, or none (a session or group keeps its number reserved).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass

TAG_VAR = "HARNESS_LAUNCH_ID"
PROC = "/proc"


def new_tag(name: str) -> str:
    """A tag unique across launches, runs and concurrent pytest processes."""
    return f"{name}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    state: str  # R, S, D, Z (zombie), ...
    session: int = 0
    start: int = 0  # clock ticks after boot: with the pid, names one process

    @property
    def dead(self) -> bool:
        return self.state in ("Z", "X", "x")


def info(pid: int) -> ProcInfo | None:
    """``/proc/<pid>/stat`` parsed, or None when there is no such process."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    rest = text[text.rfind(")") + 2:].split()  # the command name may hold spaces / parens
    try:
        return ProcInfo(pid, int(rest[1]), int(rest[2]), rest[0], int(rest[3]), int(rest[19]))
    except (IndexError, ValueError):
        return None


def identities(pids) -> dict[int, int]:
    """pid -> start time of each live process among ``pids``, now: who they are."""
    return {pid: p.start for pid in pids if (p := info(pid)) is not None and not p.dead}


def same(pid: int, start: int) -> bool:
    """``pid`` is still the live process that started at ``start``."""
    return identities([pid]).get(pid) == start


def _ours(pid: int, start: int) -> bool:
    """A session or parent found by ``pid`` is still the recorded one's: that process (a
    zombie too), or none at all (a session or group keeps its number reserved)."""
    return (p := info(pid)) is None or p.start == start


def alive(pid: int) -> bool:
    """Running or sleeping (a zombie is dead: it holds no memory, only a table entry)."""
    p = info(pid)
    return p is not None and not p.dead


def cmdline(pid: int) -> str:
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _pids() -> list[int]:
    try:
        return [int(n) for n in os.listdir(PROC) if n.isdigit()]
    except OSError:
        return []


def tagged(tag: str) -> dict[int, int]:
    """Live processes (pid -> start) whose environment carries ``HARNESS_LAUNCH_ID=<tag>``
    (never this one); the environment read between two agreeing reads of the start time."""
    needle = f"{TAG_VAR}={tag}".encode()
    me, out = os.getpid(), {}
    for pid in _pids():
        if pid == me:
            continue
        before = info(pid)
        try:
            with open(f"{PROC}/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, or not ours
            continue
        if before is not None and needle in env.split(b"\0") and same(pid, before.start):
            out[pid] = before.start
    return out


def in_sessions(leaders: dict[int, int]) -> dict[int, int]:
    """Live processes (pid -> start) in the sessions of ``leaders`` (pid -> start: each
    agent's, its launch's processes however they were started and wherever they were
    reparented), leaders included; a leader's pid now another process's names no session."""
    wanted = {pid for pid, start in leaders.items() if _ours(pid, start)}
    return {pid: p.start for pid in _pids()
            if (p := info(pid)) is not None and not p.dead and p.session in wanted}


def descendants(roots) -> dict[int, int]:
    """Live descendants (pid -> start) of ``roots`` (pids, or pid -> start: then a root
    whose pid is now another process's has none) through parent links in /proc, roots
    excluded."""
    if isinstance(roots, dict):
        roots = [pid for pid, start in roots.items() if _ours(pid, start)]
    children: dict[int, list[ProcInfo]] = {}
    for pid in _pids():
        p = info(pid)
        if p is not None and not p.dead:
            children.setdefault(p.ppid, []).append(p)
    out, todo = {}, list(roots)
    while todo:
        for c in children.get(todo.pop(), ()):
            if c.pid not in out:
                out[c.pid] = c.start
                todo.append(c.pid)
    return out


def _pidfd(pid: int) -> int | None:
    """A pidfd pinning ``pid``'s process (None: gone, or no pidfds -- signalled by pid)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _kill(pid: int, start: int, own_groups: set[int]) -> None:
    """SIGKILL the process ``pid`` that started at ``start`` and, when it leads a process
    group, that group (its children) -- nothing when the pid is now another process's."""
    fd = _pidfd(pid)
    try:
        p = info(pid)
        if p is None or p.dead or p.start != start:  # checked once pinned: the pidfd's process
            return
        if p.pgid == pid and pid not in own_groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if fd is not None:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
    finally:
        if fd is not None:
            os.close(fd)


def kill_tagged(tag: str, extra=(), timeout_s: float = 15.0) -> tuple[list[int], list[str]]:
    """Kill every process tagged ``tag`` and the ``extra`` processes (pid -> start, or pids:
    taken as they are now) still alive; repeat until none is left or ``timeout_s`` passed.
    Returns (every pid killed, "pid cmdline" of survivors)."""
    own_groups = {os.getpgrp()}  # never signal the caller's own group
    extra = dict(extra) if isinstance(extra, dict) else identities(extra)
    deadline = time.monotonic() + timeout_s
    seen: list[int] = []
    while True:
        live = {**tagged(tag),
                **{pid: start for pid, start in extra.items() if same(pid, start)}}
        if not live:
            return seen, []
        if time.monotonic() > deadline:
            return seen, [f"{p} {cmdline(p)}" for p in sorted(live)]
        for pid, start in sorted(live.items()):
            if pid not in seen:
                seen.append(pid)
            _kill(pid, start, own_groups)
        time.sleep(0.05)


# --- a launch's torchrun agents (subprocess.Popen) ---------------------------------------
def signal_all(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def terminate_gently(proc: subprocess.Popen) -> None:
    """SIGTERM the agent's group and wait (bounded): srun forwards it to the remote nodes,
    where a SIGKILL would orphan them."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
            pass


def kill_group(pgid: int, start: int) -> None:
    """SIGKILL a torchrun agent's process group (the agent that started at ``start`` and its
    forked ranks; fresh ranks are in sessions of their own, killed by tag), unless the pid is
    another process's now."""
    if not _ours(pgid, start):
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def reap(proc: subprocess.Popen) -> None:
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL'd processes reap quickly
        pass


def returncode(agents) -> int | None:
    if not agents:
        return None
    return next((p.returncode for p in agents if p.returncode), agents[0].returncode)
