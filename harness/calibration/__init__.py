"""Measured errors the tolerances are derived from (``measured.csv``, package data).

Each row: a (check, quantity, recipe, loss, metric) measured over the ``calibration`` scenario's
passing cases of one population -- backend, device, process groups' backend, world size and
module, each either a value or ``*`` (pooled over) -- as n, p99 and max. ``loss`` is the
modules' training loss (``catalog.TASK_LOSS``): ``mse`` for the single layers,
``cross_entropy`` for next-token models (LlamaStack), whose errors are measured apart.
``python -m harness calibrate`` regenerates the file (``harness/calibration/derive.py``);
``harness/calibration/tolerances.py`` turns each p99 (the max of 100 samples or more) into a
tolerance (times a stated factor).
"""

from __future__ import annotations

import csv
from pathlib import Path

MEASURED = Path(__file__).resolve().parent / "measured.csv"
KEY = ["check", "quantity", "recipe", "loss", "backend", "device", "pg_backend", "config",
       "world_size", "module", "metric"]
COLUMNS = KEY + ["n", "p99", "max", "beyond_previous"]  # see derive.py


def load(path: Path = MEASURED) -> dict[tuple, dict]:
    """``KEY`` (a tuple of strings) -> {n, p99, max}; empty if no file."""
    if not Path(path).is_file():
        return {}
    out = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            out[tuple(row[k] for k in KEY)] = dict(n=int(row["n"]), p99=float(row["p99"]),
                                                   max=float(row["max"]))
    return out


def write(rows: list[dict], path: Path = MEASURED) -> None:
    tmp = Path(path).with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in sorted(rows, key=lambda r: tuple(str(r[k]) for k in KEY)):
            w.writerow({k: _short(r.get(k, 0)) for k in COLUMNS})
    tmp.replace(path)


def _short(v):
    """A measurement as the file keeps it: 6 significant digits (a tolerance is 2x a p99 or a
    max of a population; more digits only make the file larger)."""
    return f"{v:.6g}" if isinstance(v, float) else v
