"""Room on disk: how much a run's directories need before anything starts, and a full disk
said in one line naming the directory wherever it shows up (``ENOSPC``, or ``EDQUOT`` for a
quota)::

    --report-dir /mnt/small: 0.0 MiB free on its filesystem; a run needs at least 64 MiB there
    <case>: no space left on device in /mnt/small/runs/<run>/launches/L001 (the report dir,
    --report-dir): the case did not run

Before, the writability probe (an empty file) passed on a full filesystem; the first launch
then died with ``INTERNALERROR> OSError: [Errno 28]``, or each case printed a ~740-line traceback.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

MIB = 2**20
# free space a run needs before it starts: launch plans, logs and results, the history
# (report); checkpoints and the FP32 reference of small models (work)
REPORT_MIN_FREE = 64 * MIB
WORK_MIN_FREE = 256 * MIB
FULL = 1 * MIB  # less free than this: the directory's filesystem is full
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def existing(directory: Path) -> Path:
    """``directory`` or its nearest ancestor that exists (where it would be created)."""
    p = Path(directory).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def free(directory: Path) -> int | None:
    """Bytes an unprivileged process may still write on ``directory``'s filesystem (None if
    that cannot be asked, or the filesystem has no blocks at all: /proc, /sys -- not full,
    not storage; the write probe then says why nothing can be made there)."""
    try:
        st = os.statvfs(existing(directory))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize if st.f_blocks else None


def shortage(directory: Path, need: int) -> str:
    """'' if ``directory``'s filesystem has ``need`` bytes free, else one line saying so."""
    have = free(directory)
    if have is None or have >= need:
        return ""
    return (f"{have / MIB:.1f} MiB free on its filesystem; a run needs at least "
            f"{need / MIB:.0f} MiB there")


def is_full(directory: Path) -> bool:
    have = free(directory)
    return have is not None and have < FULL


def no_space(e: BaseException | None) -> OSError | None:
    """The ENOSPC / EDQUOT error in ``e``'s chain (cause, context), or None."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in NO_SPACE:
            return e
        e = e.__cause__ or e.__context__
    return None


def where(e: OSError | None, dirs: dict[str, Path]) -> str:
    """One line: which of ``dirs`` (what it is -> directory) ran out of space -- the one
    holding the file ``e`` names, else the full ones, else all of them."""
    named = getattr(e, "filename", None)
    if named:
        d = Path(named).parent
        for what, root in dirs.items():
            if root and (d == Path(root) or Path(root) in d.parents):
                return f"no space left on device in {d} ({what})"
        return f"no space left on device in {d}"
    full = [f"{d} ({what})" for what, d in dirs.items() if d and is_full(d)]
    if full:
        return f"no space left on device in {' and '.join(full)}"
    return ("no space left on device writing the run's files (in "
            + " or ".join(f"{d} ({what})" for what, d in dirs.items() if d) + ")")
