"""Case outcomes, their order of severity and their words; which rows are cases and checks.

A history run holds three kinds of rows: one ``check == "case"`` row per case (its pytest
outcome and duration), coverage rows (``metric == "coverage"``: one per case and check, with a
status, from schema 2 on) and the rows of the checks themselves (a value against a tolerance,
or a ``trace``). Every section selects its rows through the helpers here, so coverage rows are
never counted as cases or checks.
"""

from __future__ import annotations

import pandas as pd

#: worst first: a cell takes the colour of its worst case
SEVERITY = ["failed", "xpassed", "interrupted", "xfailed", "skipped", "passed"]
SHORT = {"failed": "fail", "xpassed": "xpass", "interrupted": "stopped", "xfailed": "xfail",
         "skipped": "skip", "passed": "pass"}
MEANING = {
    "failed": "a check failed (or the case crashed / timed out) and no xfail entry explains it",
    "xpassed": "matched an xfail entry but passed: the entry is stale, remove it (strict xfail: "
               "this fails the run)",
    "interrupted": "the run was stopped (Ctrl-C / SIGTERM) before this case finished: no "
                   "result, neither a pass nor a failure",
    "xfailed": "failed as an xfail entry of scenarios/xfails.yaml says it should (known bug)",
    "skipped": "not run here (e.g. needs more ranks, or a recipe this GPU cannot run)",
    "passed": "every check passed",
}
#: the badge colour of a check row's outcome
ROW_CLASS = {"pass": "passed", "fail": "failed", "error": "failed", "info": "skipped"}
FAILED_ROWS = ("fail", "error")
NON_CHECKS = ("case", "trace")
COVERAGE_METRIC = "coverage"


def outcome(o: str) -> str:
    """A case outcome as one of :data:`SEVERITY` (anything unknown counts as failed)."""
    return o if o in SEVERITY else "failed"


def worst(outcomes) -> str:
    found = {outcome(o) for o in outcomes}
    for o in SEVERITY:
        if o in found:
            return o
    return "passed"


def badge_class(o: str) -> str:
    """The colour class of a case-outcome badge (empty -> skipped)."""
    return outcome(o) if o else "skipped"


def is_coverage(rows: pd.DataFrame) -> pd.Series:
    return rows["metric"] == COVERAGE_METRIC


def case_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per case: its outcome, duration, axes, repro."""
    return rows[(rows["check"] == "case") & ~is_coverage(rows)]


def check_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of the checks (values against tolerances), without case, trace and coverage."""
    return rows[~rows["check"].isin(NON_CHECKS) & ~is_coverage(rows)]


def coverage_rows(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[is_coverage(rows)]
