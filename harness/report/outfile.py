"""Files the ``python -m harness`` commands write (the HTML report, a bench result): checked
before the work that fills them, written whole or not at all.

:func:`problem` says in one line why a path cannot take the file (a directory, a parent that
is a file); :func:`write_text` writes through a temporary file beside the target and renames
it into place, removing the temporary file on any error -- an interrupted or failed write
leaves neither a partial file nor a ``.tmp`` behind. Errors are :class:`OutputError`, one
line naming the option and the path.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class OutputError(Exception):
    """One line: which output cannot be written and why."""


def problem(path: Path) -> str | None:
    """Why ``path`` cannot become a file (None: nothing known against it yet)."""
    if path.is_dir():
        return "is a directory; give a file name in it"
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else f"{parent} is not a directory"
    return None


def check(flag: str, path: Path) -> None:
    why = problem(path)
    if why:
        raise OutputError(f"{flag} {path}: {why}")


def write_text(flag: str, path: Path, text: str, overwrite: bool = True) -> None:
    """Write ``text`` to ``path`` atomically (parents made); OutputError on any failure, with
    nothing left behind. ``overwrite`` False: an existing file is an error."""
    check(flag, path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if the file appeared meanwhile: never replaced
            os.unlink(tmp)
        tmp = None
    except FileExistsError:
        raise OutputError(f"{flag} {path}: already exists") from None
    except OSError as e:
        raise OutputError(f"{flag} {path}: cannot write there ({e.strerror or e})") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
