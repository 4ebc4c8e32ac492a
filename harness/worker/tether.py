"""A process tied to another's life. To its parent's: ``PR_SET_PDEATHSIG`` (Linux prctl option 1)
makes the kernel SIGKILL it when its parent dies -- torchrun when pytest dies (``python -m
harness.launch.tethered``), each rank when torchrun dies (worker/main.py). To any process's
(:func:`die_with`): a forked DCP stager, not its rank's child, exits when its rank ends
(worker/stager_fork.py). Linux only; elsewhere a no-op."""

from __future__ import annotations

import ctypes
import os
import select
import signal
import threading

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


def die_with(pid: int) -> None:
    """Exit (``os._exit``) the moment process ``pid`` ends, whatever this process is doing then
    -- also waiting in a collective that would otherwise wait out its timeout. A thread waits on
    ``pid``'s pidfd; without pidfds (Linux < 5.3) it looks every 0.2 s."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd, or the process is gone already
        if not exists(pid):
            os._exit(1)
        fd = None

    def watch():
        if fd is not None:
            select.select([fd], [], [])
        else:
            while exists(pid):
                threading.Event().wait(0.2)
        os._exit(1)
    threading.Thread(target=watch, daemon=True, name=f"die-with-{pid}").start()


def exists(pid: int) -> bool:  # a zombie too; someone else's too
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
