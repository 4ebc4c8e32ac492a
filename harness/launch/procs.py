"""The processes of a launch: tag them, find them, kill them, and prove they are gone.

torchrun starts each rank in a session of its own, ranks start DCP's stager processes, and a
killed parent leaves its children to init. So every process of a launch carries
``HARNESS_LAUNCH_ID=<tag>`` in its environment and :func:`kill_tagged` finds them all in
``/proc``, kills each and its group, and waits (bounded) until none is left. The second line of
defence is ``worker.tether``. Linux only; elsewhere the scans find nothing.
"""

from __future__ import annotations

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
        return ProcInfo(pid, int(rest[1]), int(rest[2]), rest[0], int(rest[3]))
    except (IndexError, ValueError):
        return None


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


def tagged(tag: str) -> list[int]:
    """Live processes whose environment carries ``HARNESS_LAUNCH_ID=<tag>`` (never this one)."""
    needle = f"{TAG_VAR}={tag}".encode()
    me, out = os.getpid(), []
    for pid in _pids():
        if pid == me:
            continue
        try:
            with open(f"{PROC}/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, or not ours
            continue
        if needle in env.split(b"\0") and alive(pid):
            out.append(pid)
    return out


def in_sessions(sessions) -> set[int]:
    """Live processes in the sessions ``sessions`` (each agent's: its launch's processes
    however they were started and wherever they were reparented), leaders included."""
    wanted, out = set(sessions), set()
    for pid in _pids():
        p = info(pid)
        if p is not None and not p.dead and p.session in wanted:
            out.add(pid)
    return out


def descendants(roots) -> set[int]:
    """Live descendants of ``roots`` (through parent links in /proc), roots excluded."""
    children: dict[int, list[int]] = {}
    for pid in _pids():
        p = info(pid)
        if p is not None and not p.dead:
            children.setdefault(p.ppid, []).append(pid)
    out, todo = set(), list(roots)
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _kill(pid: int, own_groups: set[int]) -> None:
    """SIGKILL ``pid`` and, when it leads a process group, that group (its children)."""
    p = info(pid)
    if p is None or p.dead:
        return
    if p.pgid == pid and p.pgid not in own_groups:
        try:
            os.killpg(p.pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_tagged(tag: str, extra=(), timeout_s: float = 15.0) -> tuple[list[int], list[str]]:
    """Kill every process tagged ``tag`` and the ``extra`` pids still alive; repeat until none
    is left or ``timeout_s`` passed. Returns (every pid killed, "pid cmdline" of survivors)."""
    own_groups = {os.getpgrp()}  # never signal the caller's own group
    deadline = time.monotonic() + timeout_s
    seen: list[int] = []
    while True:
        live = sorted(set(tagged(tag)) | {p for p in extra if alive(p)})
        if not live:
            return seen, []
        if time.monotonic() > deadline:
            return seen, [f"{p} {cmdline(p)}" for p in live]
        for pid in live:
            if pid not in seen:
                seen.append(pid)
            _kill(pid, own_groups)
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


def kill_group(pgid: int) -> None:
    """SIGKILL a process group: a torchrun agent's (the agent and its forked ranks; fresh ranks
    are in sessions of their own and are killed by tag)."""
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
