"""A process tied to its parent's life: ``PR_SET_PDEATHSIG`` (Linux prctl option 1) makes the
kernel SIGKILL it when its parent dies -- torchrun when pytest dies (``python -m
harness.launch.tethered``), each rank when torchrun dies (worker/main.py). Linux only; elsewhere
a no-op."""

from __future__ import annotations

import ctypes
import os
import signal

PARENT_VAR = "HARNESS_PARENT_PID"  # the pid a tethered process expects as its parent
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def tether(expected_parent: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (PR_SET_PDEATHSIG).

    The parent may already have died before this runs (the request then never fires): when
    ``expected_parent`` is given and is no longer our parent, exit at once. Returns whether the
    request was made (False off Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)  # orphaned before the tether held: nobody waits for this process
    return True


def set_name(name: str) -> None:
    """This process's name as ``ps -o comm`` / ``top`` / ``/proc/PID/comm`` show it (at most 15
    bytes; Linux only, else nothing): a forked rank's command line is its agent's."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def expected_parent() -> int | None:
    """The parent pid a tethered process was started under (``HARNESS_PARENT_PID``)."""
    try:
        return int(os.environ[PARENT_VAR])
    except (KeyError, ValueError):
        return None
