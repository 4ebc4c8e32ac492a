"""Ctrl-C and SIGTERM: stop a run within seconds, leave nothing running, keep what finished.

* SIGINT already raises KeyboardInterrupt in pytest's main thread; :func:`install` makes
  SIGTERM do the same, so a CI job's cancel (SIGTERM) takes pytest's interrupted path too:
  every launch's ``finally`` kills its processes, the cases already finished are written to the
  history, the unfinished ones are recorded as ``interrupted``, and pytest exits 2.
* :func:`deferred` holds SIGINT / SIGTERM while cleanup runs (killing a launch, writing the
  history), so a second Ctrl-C cannot cut it short; the signal is delivered right after.
* :func:`unfinished` gives the selected cases that never reported an outcome theirs.

Signal handlers can only be changed in the main thread; elsewhere these are no-ops (worker
threads are never interrupted by signals in Python: the main thread stops them, see
Launcher.stop).
"""

from __future__ import annotations

import faulthandler
import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

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
def deferred():
    """Run the block with SIGINT / SIGTERM held; deliver a held signal when it ends."""
    if not _main_thread():
        yield
        return
    got: list[int] = []

    def hold(signum, frame):
        got.append(signum)

    try:
        old = {s: signal.signal(s, hold) for s in HELD}
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for s in dict.fromkeys(got):
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


def unfinished(hs, collected: dict):
    """(case id, outcome, info) for each selected case without an outcome in ``collected``
    (case id -> (outcome, info)); ``hs``: the HarnessSession.

    A case whose tasks all finished before the stop (in a launch cut short) gets its real
    outcome; one collection had decided to skip is ``skipped``; the rest are ``interrupted``.
    Under pytest-xdist the controller holds no items and no results: cases it never got a
    report for are ``interrupted``."""
    for cid, item in hs.selected_items.items():
        if cid not in collected:
            yield (cid, *_item_outcome(hs, item))
    for cid, case in hs.selected_cases.items():
        if cid not in collected:
            yield cid, INTERRUPTED, case_info(hs, case)


def _item_outcome(hs, item) -> tuple[str, dict]:
    if item.skip_reason:
        return "skipped", item.info()
    res = hs.scheduler.finished(item.case) if hs.scheduler is not None else None
    if res is None:
        info = item.info()
        info.update(status=INTERRUPTED, summary=SUMMARY)
        return INTERRUPTED, info
    item.result = res
    return _outcome(hs, item, res), item.info()


def _outcome(hs, item, res) -> str:
    """What pytest would have reported (CaseItem.runtest + the strict xfail marker): the
    verdict of the exact xfail semantics."""
    from . import verdict
    item.verdict = v = verdict.judge(res.rows, res.status, res.errors, item.entries)
    return v.outcome


SUMMARY = "interrupted: the run was stopped (Ctrl-C / SIGTERM) before this case finished"


def case_info(hs, case) -> dict:
    """The per-case dict the plugin's reports carry (CaseItem.info), for an interrupted case
    the xdist controller knows only by id."""
    return dict(run_id=hs.run_id, case_id=case.id, case_key=case.key, scenario=case.scenario,
                backend=case.backend, device=hs.device, axes=[list(a) for a in case.axes],
                repro=hs.repro(SimpleNamespace(case=case)), skip_reason="", xfail_entry=None,
                xfail_reason="", status=INTERRUPTED, seconds=0.0, rows=[], launches=[],
                summary=SUMMARY)
