"""Coverage: which checks ran on which cases, and the holes where a check never ran.

Coverage rows (schema 2 on): ``metric == "coverage"``, ``quantity == "*"``, one per (case,
check); ``row_outcome`` is the check's status (passed / failed / xfailed / not_run) and
``detail`` the reason (why it did not run, which xfail entry). A *hole* is a (check, recipe)
where the check never ran on any case: nothing passed, failed or xfailed, only not_run.
"""

from __future__ import annotations

from collections import Counter

import pandas as pd

from harness.report.context import ReportContext, coord
from harness.report.outcomes import case_rows, coverage_rows

#: worst first: a cell takes the colour of its worst status
STATUSES = ("failed", "xfailed", "not_run", "passed")
LABEL = {"failed": "fail", "xfailed": "xfail", "not_run": "not run", "passed": "pass"}
#: the colour class of each status (the outcome matrix's colours)
CLASS = {"failed": "failed", "xfailed": "xfailed", "not_run": "skipped", "passed": "passed"}
#: the check x case table starts collapsed above this many cases
OPEN_CASES = 12
NO_ROWS = "no coverage rows in this run (recorded since schema 2)"


def status(s: str) -> str:
    """A coverage status as one of :data:`STATUSES` (anything unknown counts as failed)."""
    return s if s in STATUSES else "failed"


def worst(statuses) -> str:
    found = set(statuses)
    return next((s for s in STATUSES if s in found), "passed")


def _most_common(reasons) -> str:
    reasons = [r for r in reasons if r]
    return Counter(reasons).most_common(1)[0][0] if reasons else ""


def summarize(rows: pd.DataFrame) -> dict | None:
    """Coverage of one run of one group: the check x recipe counts, holes, check x case statuses.

    ``rows``: the run's rows (any kind; only coverage rows are read). None without coverage
    rows. Checks and recipes keep the order they first appear in; one (case, check) appearing
    twice keeps its worst status.
    """
    cov = coverage_rows(rows)
    if cov.empty:
        return None
    cov = pd.DataFrame({"case": cov["case_id"], "check": cov["check"],
                        "recipe": cov["recipe"].map(coord),
                        "status": cov["row_outcome"].map(status), "detail": cov["detail"]})
    cov["rank"] = cov["status"].map(STATUSES.index)
    cov = cov.sort_values("rank", kind="stable").drop_duplicates(["case", "check"])
    cov = cov.sort_index()
    checks = list(dict.fromkeys(cov["check"]))
    recipes = list(dict.fromkeys(cov["recipe"]))
    by_recipe, holes = [], []
    for check in checks:
        cells = []
        for recipe in recipes:
            sel = cov[(cov["check"] == check) & (cov["recipe"] == recipe)]
            cells.append(_recipe_cell(sel))
            if cells[-1] and cells[-1]["hole"]:
                holes.append({"check": check, "recipe": recipe, "reason": cells[-1]["reason"],
                              "n_cases": cells[-1]["n_cases"]})
        by_recipe.append({"check": check, "cells": cells})
    known = list(case_rows(rows)["case_id"])
    cases = list(dict.fromkeys([c for c in known if c in set(cov["case"])] + list(cov["case"])))
    at = {(c, k): (s, d) for c, k, s, d in zip(cov["case"], cov["check"], cov["status"],
                                                cov["detail"])}
    by_case = [{"case": c, "cells": [({"status": at[(c, k)][0], "detail": at[(c, k)][1]}
                                      if (c, k) in at else None) for k in checks]}
               for c in cases]
    return {"checks": checks, "recipes": recipes, "by_recipe": by_recipe, "holes": holes,
            "by_case": by_case, "n_cases": len(cases)}


def _recipe_cell(sel: pd.DataFrame) -> dict | None:
    """The statuses of one check on the cases of one recipe (None: no such case)."""
    if sel.empty:
        return None
    counts = Counter(sel["status"])
    return {"counts": [(s, counts[s]) for s in STATUSES if counts.get(s)],
            "worst": worst(counts), "n_cases": len(sel),
            "hole": counts.get("not_run", 0) == len(sel),
            "reason": _most_common(sel.loc[sel["status"] == "not_run", "detail"])}


def coverage(ctx: ReportContext) -> list[dict]:
    """Per group (latest run): its coverage summary, with case links; ``summary`` None when
    the run has no coverage rows."""
    out = []
    for g in ctx.groups:
        s = summarize(ctx.rows(g))
        if s is not None:
            for c in s["by_case"]:
                c["ref"] = ctx.case_ref(c["case"], g.hw, g.backend)
        out.append({"label": g.label, "run_id": ctx.run(g.runs[-1])["run_id"], "summary": s,
                    "open": s is not None and s["n_cases"] <= OPEN_CASES})
    return out
