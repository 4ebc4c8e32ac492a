"""Collects one rank's result rows for a case; ``merge`` agrees them across ranks."""

from __future__ import annotations

import math

from ..tolerances import Tolerance
from .compare import Comparison, compare


class CheckFailed(AssertionError):
    pass


class Recorder:
    """Rows: dict(check, quantity, metric, value, tolerance, outcome, detail)."""

    def __init__(self):
        self.rows: list[dict] = []

    def _row(self, check, quantity, metric, value, tolerance, ok, detail=""):
        self.rows.append(dict(check=check, quantity=quantity, metric=metric, value=float(value),
                              tolerance=float(tolerance), outcome="pass" if ok else "fail",
                              detail=detail))

    def compare(self, check: str, quantity: str, actual: dict, expected: dict,
                tol: Tolerance) -> Comparison:
        c = compare(actual, expected)
        ok = c.passes(tol)
        detail = c.describe(tol)
        if tol.bitwise:
            self._row(check, quantity, "n_diff", c.n_diff + len(c.problems), 0, ok, detail)
        self._row(check, quantity, "max_abs", c.max_abs, tol.max_abs, ok, detail)
        self._row(check, quantity, "rel_l2", c.rel_l2, tol.rel_l2, ok, detail)
        return c

    def flag(self, check: str, quantity: str, ok: bool, detail: str) -> None:
        """A yes/no check (e.g. a placement): value 0 when it holds, 1 when not."""
        self._row(check, quantity, "violations", 0 if ok else 1, 0, ok, detail)

    def failures(self) -> list[dict]:
        return [r for r in self.rows if r["outcome"] != "pass"]


def merge(per_rank: list[list[dict]]) -> list[dict]:
    """One row per (check, quantity, metric): the worst value over ranks, fail if any failed."""
    merged: dict[tuple, dict] = {}
    for rank, rows in enumerate(per_rank):
        for r in rows:
            k = (r["check"], r["quantity"], r["metric"])
            cur = merged.get(k)
            worse = cur is None or (r["outcome"] != "pass" and cur["outcome"] == "pass") or (
                r["outcome"] == cur["outcome"] and _gt(r["value"], cur["value"]))
            if worse:
                merged[k] = dict(r, rank=rank)
    return list(merged.values())


def _gt(a: float, b: float) -> bool:
    if math.isnan(a):
        return not math.isnan(b)
    return a > b
