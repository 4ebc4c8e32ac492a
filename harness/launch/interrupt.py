"""Ctrl-C and SIGTERM: stop a run within seconds, leave nothing running, keep what finished.
:func:`install` makes SIGTERM raise KeyboardInterrupt like SIGINT (a CI cancel takes pytest's
interrupted path: every launch's ``finally`` kills its processes, finished cases are written,
the rest recorded ``interrupted``); :func:`deferred` holds both while clean-up runs (bounded).
Signal handlers change only in the main thread; elsewhere these are no-ops.
"""

from __future__ import annotations

import faulthandler
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

HELD = (signal.SIGINT, signal.SIGTERM)
INTERRUPTED = "interrupted"  # case outcome and status of a case the run stopped before it ended


class Interrupted(KeyboardInterrupt):
    """Raised in launcher threads when the run is being stopped (Launcher.stop)."""


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def install() -> object:
    """SIGTERM -> KeyboardInterrupt (pytest's interrupted path). Returns the previous handler
    for :func:`uninstall`, or None when nothing was changed."""
    if not _main_thread():
        return None
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return None  # someone else handles SIGTERM (e.g. a CI wrapper): leave it
        return signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:  # not the main interpreter
        return None


def uninstall(previous) -> None:
    if previous is not None and _main_thread():
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def deferred(grace_s: float = 10.0):
    """Run the block with SIGINT / SIGTERM held; deliver them when it ends, or in it (as a
    KeyboardInterrupt) ``grace_s`` after the first: a hung clean-up cannot outlive a stop."""
    if not _main_thread():
        yield
        return
    got: list[int] = []  # the held signals; 0 once the grace is over
    late = threading.Timer(grace_s, lambda: (got.append(0), signal.raise_signal(got[0])))

    def hold(signum, frame):
        if 0 in got:
            raise KeyboardInterrupt(f"clean-up did not end within {grace_s:g} s of the stop")
        got.append(signum)
        if len(got) == 1:
            late.start()

    try:
        old = {s: signal.signal(s, hold) for s in HELD}
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        late.cancel()
        for s, h in old.items():
            signal.signal(s, h)
        for s in dict.fromkeys(got if 0 not in got else ()):
            signal.raise_signal(s)  # handled by the restored handler (KeyboardInterrupt)


def stacks_on_sigusr1(path: Path):
    """``kill -USR1 <pytest pid>`` appends every thread of this process's Python stack to
    ``path`` (what the ranks' ``stacks/rank*.txt`` are for a hung rank, for pytest itself).
    Returns the open file (``None`` where SIGUSR1 is someone else's or not settable here)."""
    if not _main_thread() or not hasattr(signal, "SIGUSR1") \
            or signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a")
    faulthandler.register(signal.SIGUSR1, file=f, all_threads=True)
    return f


def no_stacks_on_sigusr1(f) -> None:
    if f is not None and _main_thread():
        faulthandler.unregister(signal.SIGUSR1)
        f.close()
