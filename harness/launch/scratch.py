"""Temporary directories a run makes -- its work dir (checkpoints, in /dev/shm by default: RAM
on a GPU box) and each launch's TMPDIR (torchrun's log dir, multiprocessing's ``pymp-*``) --
named with the pid of the process that made them::

    /dev/shm/harness-20261125T100037-14350-8b387ce5a6d7-p14350-k2j4x9a1
    /tmp/harness-L001-p14350-e7n3x7un

A run removes its own when it ends; a run that is SIGKILLed cannot. A later run removes those
whose maker is dead (:func:`sweep`) and says so in one line. Directories of live processes,
of other users and without the mark are left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from harness.worker.tether import exists

_MARKED = re.compile(r"^harness-.+-p(?P<pid>\d+)-[A-Za-z0-9_]{8}$")


def prefix(what: str) -> str:
    """``tempfile.mkdtemp``'s prefix for a directory of ``what`` made by this process."""
    return f"harness-{what}-p{os.getpid()}-"


def owner(path: Path) -> int | None:
    """The pid in a marked directory's name, else None."""
    m = _MARKED.match(Path(path).name)
    return int(m["pid"]) if m else None


def parents(work_dir: str | Path | None = None) -> list[Path]:
    """Where a run's temporary directories go: --work-dir, /dev/shm, the temporary directory,
    /tmp (existing ones, each once)."""
    out: list[Path] = []
    for p in (work_dir, "/dev/shm", tempfile.gettempdir(), "/tmp"):
        if p and Path(p).is_dir() and Path(p).resolve() not in out:
            out.append(Path(p).resolve())
    return out


def leftovers(dirs: list[Path]) -> list[Path]:
    """Marked directories in ``dirs`` of this user whose maker is dead."""
    out = []
    uid = os.getuid()
    for parent in dirs:
        try:
            entries = list(Path(parent).iterdir())
        except OSError:
            continue
        for p in entries:
            pid = owner(p)
            try:
                mine = p.is_dir() and not p.is_symlink() and p.stat().st_uid == uid
            except OSError:
                continue
            if pid is not None and mine and pid != os.getpid() and not exists(pid):
                out.append(p)
    return out


def _size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def sweep(dirs: list[Path]) -> str:
    """Remove the leftovers in ``dirs``; one line saying what went, or ''."""
    gone, pids, size = [], set(), 0
    for p in leftovers(dirs):
        n = _size(p)
        shutil.rmtree(p, ignore_errors=True)
        if not p.exists():
            gone.append(p)
            pids.add(owner(p))
            size += n
    if not gone:
        return ""
    where = ", ".join(sorted({str(p.parent) for p in gone}))
    return (f"harness: removed {len(gone)} temporary director{'y' if len(gone) == 1 else 'ies'}"
            f" left in {where} by runs that were killed (pids "
            f"{', '.join(map(str, sorted(pids)))}; {size / 2**20:.1f} MiB)")
