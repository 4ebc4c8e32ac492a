"""The data of every report section, computed from the history (no HTML here).

:func:`build` returns one entry per section, by the name of its template
(``templates/<name>.html.j2``): plain dicts, lists and numbers, formatted by the templates.
"""

from __future__ import annotations

from harness.report.context import ReportContext
from harness.report.sections import (
    coverage,
    drift_plots,
    fixes,
    ledger,
    matrix,
    overview,
    runs,
)

#: (anchor, title) of the navigation bar, in page order; "fixes" only when there are any
NAV = [("latest", "Latest run"), ("changes", "What changed"), ("drift-alerts", "Drift alerts"),
       ("matrix", "Outcome matrix"), ("coverage", "Coverage"), ("drift", "Drift plots"),
       ("xfails", "Xfail ledger"), ("fixes", "Fixes and mutants"), ("timing", "Timing"),
       ("runs", "Runs"), ("details", "Case details")]


def build(ctx: ReportContext) -> dict:
    matrices = matrix.matrices(ctx)  # first: registers the anchors other sections link to
    data = {
        "problems": overview.problems(ctx),
        "header": overview.header(ctx),
        "changes": overview.changes(ctx),
        "drift_alerts": overview.drift_alerts(ctx),
        "legend": matrix.legend(),
        "matrices": matrices,
        "coverage": coverage.coverage(ctx),
        "drift_plots": drift_plots.drift_plots(ctx),
        "ledger": ledger.ledger(ctx),
        "fixes": fixes.fixes(ctx),
        "mutants": fixes.mutation_table(ctx),
        "timing": runs.timing(ctx),
        "runs": runs.runs(ctx),
        "details": matrix.details(ctx, matrices),
    }
    data["nav"] = [(a, t) for a, t in NAV
                   if a != "fixes" or data["fixes"] or data["mutants"]["rows"]]
    return data
