"""Measured errors the tolerances are derived from (``measured.csv``, package data).

Each row: a (check, quantity, recipe, loss, metric) and the error measured for it over the
``calibration`` scenario's cases -- several seeds, meshes and modules, on every backend and
device it ran on (reference / torch on CPU, te on GPU) -- as n, p99 and max, with the sources.
``loss`` is the modules' training loss (``catalog.TASK_LOSS``): ``mse`` for the single layers,
``cross_entropy`` for next-token models (LlamaStack), whose errors are measured apart.
``python -m harness calibrate`` regenerates the file (``harness/calibration/derive.py``);
``harness/tolerances.py`` turns each p99 into a tolerance (times a stated factor).
"""

from __future__ import annotations

import csv
from pathlib import Path

MEASURED = Path(__file__).resolve().parent / "measured.csv"
COLUMNS = ["check", "quantity", "recipe", "loss", "metric", "n", "p99", "max", "sources"]
DEFAULT_LOSS = "mse"  # files written before the loss column measured MSE modules only


def load(path: Path = MEASURED) -> dict[tuple[str, str, str, str, str], dict]:
    """(check, quantity, recipe, loss, metric) -> {n, p99, max, sources}; empty if no file."""
    if not Path(path).is_file():
        return {}
    out = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            key = (row["check"], row["quantity"], row["recipe"],
                   row.get("loss") or DEFAULT_LOSS, row["metric"])
            out[key] = dict(n=int(row["n"]), p99=float(row["p99"]), max=float(row["max"]),
                            sources=row["sources"])
    return out


def write(rows: list[dict], path: Path = MEASURED) -> None:
    tmp = Path(path).with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in sorted(rows, key=lambda r: (r["check"], r["quantity"], r["recipe"], r["loss"],
                                             r["metric"])):
            w.writerow({k: r[k] for k in COLUMNS})
    tmp.replace(path)
