"""A disk that fills up during a run, said per case in one line naming the directory: a lane
that cannot write its launch's plan or queue (``OSError: [Errno 28]`` in its thread, raised
again for every case that waits on it) and a launch whose ranks died while a run directory was
full. (Before anything starts ``options.check_dirs`` asks for room; at the end the run record
says so if its reports could not be written.)"""

from __future__ import annotations

from pathlib import Path

from harness.launch import disk
from harness.launch.launch import scratch_parent


class NotRun(Exception):
    """The case could not run (its files could not be written): no xfail entry explains it."""


def run_dirs(hs) -> dict[str, Path]:
    """What each directory the run writes to is -> the directory."""
    out = {"the report dir, --report-dir": hs.record.report_dir}
    if hs.execution is not None:
        out["the work dir, --work-dir"] = hs.execution.work
    out["the launches' temporary dir, TMPDIR"] = Path(scratch_parent())
    return out


def not_run(hs, case_id: str, e: BaseException) -> NotRun | None:
    """The one-line :class:`NotRun` for an error that is a full disk, else None."""
    err = disk.no_space(e)
    if err is None:
        return None
    return NotRun(f"{case_id}: {disk.where(err, run_dirs(hs))}: the case did not run")


def full_line(hs) -> str:
    """'no space left on device in DIR (what)' for the run's full directories, or ''."""
    full = [f"{d} ({what})" for what, d in run_dirs(hs).items() if disk.is_full(d)]
    return f"no space left on device in {' and '.join(full)}" if full else ""
