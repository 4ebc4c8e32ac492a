"""The results store: the one directory a run writes its results to and the tools read them
from. Results are never committed: the store is any directory a run is pointed at (a CI
artifact, a shared disk, a bucket mounted as a directory).

Layout of a store (``DIR``)::

    DIR/history/<run_id>.parquet   every result row of one run, run metadata in the schema
    DIR/runs/<run_id>/             summary.csv, meta.json, launches/L###/ (plans, rank logs)
    DIR/report.html                the dashboard (``python -m harness report``)
    DIR/bench/<label>.json         ``python -m harness bench`` measurements

Which directory: the one given (``pytest --report-dir DIR``, ``python -m harness report
--store DIR``), else ``$HARNESS_RESULTS``, else ``reports/`` (relative to the project root for
pytest, to the working directory for the tools; git-ignored, so a run never adds files to the
checkout). Merging the stores of several machines is copying their ``history/`` files into one.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "HARNESS_RESULTS"
DEFAULT = Path("reports")


def store_dir(given: str | os.PathLike | None = None, base: Path | None = None) -> Path:
    """The store: ``given``, else ``$HARNESS_RESULTS``, else ``reports``; a relative path is
    taken relative to ``base`` (default: the working directory). ``~`` is expanded."""
    chosen = given or os.environ.get(ENV) or None
    path = Path(chosen).expanduser() if chosen else DEFAULT
    return path if path.is_absolute() or base is None else base / path


def run_store(given: str | None, root: Path, here: Path) -> Path:
    """A pytest run's store: ``--report-dir`` (``given``), else ``$HARNESS_RESULTS`` -- either
    relative to the invocation directory ``here`` -- else ``<root>/reports``."""
    chosen = given or os.environ.get(ENV)
    return here / Path(chosen).expanduser() if chosen else root / DEFAULT


def history_dir(store: Path) -> Path:
    """Where a store keeps its runs' parquet files."""
    return store / "history"
