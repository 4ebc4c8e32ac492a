"""Fix verification and mutants: each fix off on its own (reference ``fixes: no_<fix>``) and each
mutant of the installed TE (te ``mutation: no_<fix>``) must fail (xfail), the clean case must
pass; and one table over both with the mutation score (``harness/verdict/mutation_score.py``)."""

from __future__ import annotations

import pandas as pd

from harness.report.context import ReportContext, axes
from harness.report.outcomes import FAILED_ROWS, case_rows, check_rows, coverage_rows
from harness.verdict import mutation_score

SWITCHES = mutation_score.SWITCHES  # axis -> value with no bug injected

DETAIL_CHARS = 160


def verdict(off: str, on: str | None) -> tuple[str, str]:
    """(verdict, badge class) from the outcome with the fix off and with every fix on."""
    if on is None:
        return "no matching fixes=all case", "skipped"
    if off == "xfailed" and on == "passed":
        return "verified: fails without the fix, passes with it", "passed"
    if off == "failed" and on == "passed":
        return ("fails without the fix, but unexpectedly: no xfail entry (or not the declared "
                "failure)"), "failed"
    if off == "passed":
        return "not verified: passes without the fix", "failed"
    if off == "skipped" or on == "skipped":
        return "skipped", "skipped"
    return f"fix does not work: with it the case {on}", "failed"


def fixes(ctx: ReportContext) -> list[dict]:
    """Per group with a ``fixes`` axis (latest run): one line per fix."""
    blocks = []
    for g in ctx.groups:
        rows = ctx.rows(g)
        cases = case_rows(rows)
        by_coords = {}
        for c, a, o in zip(cases["case_id"], map(axes, cases["axes"]), cases["case_outcome"]):
            for axis, clean in SWITCHES.items():
                if axis in a:
                    rest = tuple(sorted((k, str(v)) for k, v in a.items() if k != axis))
                    value = str(a[axis])
                    by_coords[(rest, "all" if value == clean else value)] = (c, o)
        if not by_coords:
            continue
        checks = check_rows(rows)
        failing = checks[checks["row_outcome"].isin(FAILED_ROWS)]
        lines = []
        for (rest, fx), (c, o) in sorted(by_coords.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            if not fx.startswith("no_"):
                continue
            on = by_coords.get((rest, "all"))
            bad = failing[failing["case_id"] == c].drop_duplicates(["check", "quantity"])
            text, cls = verdict(o, on[1] if on else None)
            lines.append({
                "fix": fx[3:], "where": ", ".join(f"{k}={v}" for k, v in rest),
                "off": {"ref": ctx.case_ref(c, g.hw, g.backend), "outcome": o},
                "failed": [{"check": r.check, "quantity": r.quantity,
                            "detail": r.detail[:DETAIL_CHARS]} for r in bad.itertuples()],
                "on": ({"ref": ctx.case_ref(on[0], g.hw, g.backend), "outcome": on[1]}
                       if on else None),
                "verdict": text, "verdict_class": cls})
        if lines:
            blocks.append({"label": g.label, "fixes": lines})
    return blocks


def mutation_table(ctx: ReportContext) -> dict:
    """Fixes and mutants in one table over the latest run of every group: verdict (caught /
    masked / survived / ineffective / crashed / timed_out), the checks that caught it, and the score per backend and TE
    version."""
    cases = []
    for g in ctx.groups:
        rows = ctx.rows(g)
        cs = case_rows(rows)
        checks = pd.concat([check_rows(rows), coverage_rows(rows)])  # coverage: what was explained
        te = str(rows["te_version"].iloc[0]) if "te_version" in rows and len(rows) else ""
        status = cs["case_status"] if "case_status" in cs else [None] * len(cs)
        for c, a, o, st in zip(cs["case_id"], map(axes, cs["axes"]), cs["case_outcome"], status):
            if not any(k in a for k in SWITCHES) or o == "skipped":
                continue
            mine = checks[checks["case_id"] == c]
            cases.append(dict(case_id=c, scenario=g.scenario, status=st or None,
                              backend=f"{g.backend}" + (f" (TE {te})" if te else ""),
                              axes={k: str(v) for k, v in a.items()}, outcome=o,
                              rows=[dict(check=r.check, quantity=r.quantity, metric=r.metric,
                                         value=r.value, outcome=r.row_outcome, phase=r.phase,
                                         detail=r.detail)
                                    for r in mine.itertuples()]))
    table = mutation_score.table(cases)
    for r in table:
        r["ref"] = ctx.case_ref(r["case_id"], *_hw_backend(ctx, r["case_id"]))
    return {"rows": table, "scores": mutation_score.scores(table)}


def _hw_backend(ctx: ReportContext, case_id: str) -> tuple:
    for g in ctx.groups:
        if case_id in set(case_rows(ctx.rows(g))["case_id"]):
            return g.hw, g.backend
    return "", ""
