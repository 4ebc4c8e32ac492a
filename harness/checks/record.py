"""Collects one rank's result rows for a case; ``merge`` agrees them across ranks.

Row outcomes: ``pass`` / ``fail`` (a check's verdict), ``unjudged`` (measured, no tolerance for
the case's configuration yet: the plugin judges it by one calibrated on demand), ``error`` (the check raised; the row
names the check that was running) and ``info`` (a trace such as the per-step loss, no verdict).

Coverage rows (``metric == "coverage"``, ``quantity == "*"``): one per check and producer of
the case, outcome ``passed`` / ``failed`` / ``not_run`` (the plugin turns ``failed`` into
``xfailed`` where the xfail registry explains every failure), detail the reason.
"""

from __future__ import annotations

import contextlib
import math
import traceback

from harness.calibration.tolerances import UNJUDGED, Tolerance
from harness.checks.compare import Comparison, compare
from harness.checks.outcomes import COVERAGE, FAILED, PROBLEMS
from harness.distributed.checkpoint import describe


class Recorder:
    """Rows: dict(check, quantity, metric, value, tolerance, outcome, detail)."""

    def __init__(self):
        self.rows: list[dict] = []

    def _row(self, check, quantity, metric, value, tolerance, outcome, detail="", source=""):
        self.rows.append(dict(check=check, quantity=quantity, metric=metric, value=float(value),
                              tolerance=float(tolerance), outcome=outcome, detail=detail,
                              tolerance_source=source))

    def compare(self, check: str, quantity: str, actual: dict, expected: dict,
                tol: Tolerance, over: tuple[int, str] | None = None) -> Comparison:
        """One comparison's rows; ``over``: (elements beyond a bound of the check's own -- e.g.
        element-wise --, what they are): none may be, its row is ``n_over``."""
        c = compare(actual, expected)
        holds = over is None or over[0] == 0
        outcome = "pass" if c.passes(tol) and holds else "fail"
        if tol.unjudged and holds and not c.fails_anyway(tol):
            outcome = UNJUDGED  # measured; judged later by a tolerance for its configuration
        detail = c.describe(tol) + ("" if holds else f"; {over[1]}")
        if tol.unjudged:  # a structural failure fails whatever tolerance is derived later
            detail += ("; fails whatever its tolerance (none derived for it yet)"
                       if c.fails_anyway(tol) else f"; unjudged: {tol.reason}")
        if tol.bitwise:
            self._row(check, quantity, "n_diff", c.n_diff + len(c.problems) + len(c.nonfinite),
                      0, outcome, detail)
        if over is not None:
            self._row(check, quantity, "n_over", over[0], 0, outcome, detail)
        if not tol.bitwise and c.fails_anyway(tol):  # no size of max_abs / rel_l2 says these
            self._row(check, quantity, PROBLEMS, len(c.problems) + len(c.nonfinite or ()), 0,
                      outcome, detail)
        self._row(check, quantity, "max_abs", c.max_abs, tol.max_abs, outcome, detail, tol.source)
        self._row(check, quantity, "rel_l2", c.rel_l2, tol.rel_l2, outcome, detail, tol.source)
        return c

    def flag(self, check: str, quantity: str, ok: bool, detail: str) -> None:
        """A yes/no check (e.g. a placement): value 0 when it holds, 1 when not."""
        self._row(check, quantity, "violations", 0 if ok else 1, 0, "pass" if ok else "fail", detail)

    def measure(self, check: str, quantity: str, metric: str, value: float,
                detail: str = "") -> None:
        """A measured value kept in the history (plots, tables), no verdict of its own."""
        self._row(check, quantity, metric, value, math.nan, "info", detail)

    def status(self, unit: str, status: str, detail: str = "") -> None:
        """The coverage row of a check or producer: passed / failed / not_run (reason)."""
        self._row(unit, "*", COVERAGE, math.nan, math.nan, status, detail)

    def note(self, unit: str, quantity: str, detail: str) -> None:
        """Information attached to a unit, no verdict (e.g. a workaround that was applied)."""
        self._row(unit, quantity, "note", math.nan, math.nan, "info", detail)

    def failed(self, unit: str) -> list[dict]:
        return [r for r in self.rows if r["check"] == unit and r["outcome"] in FAILED]

    def trace(self, quantity: str, values) -> None:
        """Per-step values kept for goldens and plots (no verdict)."""
        for i, v in enumerate(values):
            self._row("trace", quantity, f"step{i}", v, math.nan, "info")

    @contextlib.contextmanager
    def section(self, check: str, quantity: str = "error"):
        """Attribute an exception raised inside to ``check`` (an ``error`` row carrying the
        traceback), then re-raise."""
        try:
            yield
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # DCP's CheckpointException derives from BaseException
            self._row(check, quantity, "exception", 1, 0, "error", describe(e))
            self.rows[-1]["traceback"] = traceback.format_exc()[-6000:]
            raise

    def failures(self) -> list[dict]:
        return [r for r in self.rows if r["outcome"] in FAILED]


def merge(per_rank: list[list[dict]]) -> list[dict]:
    """One row per (check, quantity, metric): the worst value over ranks, failed if any failed."""
    merged: dict[tuple, dict] = {}
    for rank, rows in enumerate(per_rank):
        for r in rows:
            k = (r["check"], r["quantity"], r["metric"])
            cur = merged.get(k)
            bad, cur_bad = r["outcome"] in FAILED, cur is not None and cur["outcome"] in FAILED
            worse = cur is None or (bad and not cur_bad) or (bad == cur_bad and _gt(r["value"], cur["value"]))
            if worse:
                merged[k] = dict(r, rank=rank)
    out = list(merged.values())
    bad_units = {r["check"] for r in out if r["outcome"] in FAILED}
    for r in out:  # a unit that ran failed if any rank recorded a failure for it
        if r["metric"] == COVERAGE and r["outcome"] == "passed" and r["check"] in bad_units:
            r["outcome"] = "failed"
    return out


def _gt(a: float, b: float) -> bool:
    if math.isnan(a):
        return not math.isnan(b)
    return a > b
