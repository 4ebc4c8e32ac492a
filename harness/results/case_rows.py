"""One case's rows as the history keeps them, made from what the plugin's report carries (the
rows its launches produced and the verdict on them): the ``case`` row with the outcome, every
coverage row with the status the verdict gave its unit, and for a case with a bug switched on
the failures its clean twin's xfail entries do not explain (what caught the bug)."""

from __future__ import annotations

import json

from harness.checks.outcomes import COVERAGE
from harness.verdict.mutation_score import NEW_VS_CLEAN, NO_NEW_FAILURE


def case_rows(info: dict, outcome: str) -> list[dict]:
    """Rows for one case from the dict the plugin attaches to its report (``CaseItem.info``):
    a ``case`` row with its outcome, then its rows as the verdict has them."""
    ax = dict(info["axes"])
    base = dict(run_id=info["run_id"], case_id=info["case_id"], scenario=info["scenario"],
                backend=info["backend"], device=info["device"], recipe=ax.get("recipe"),
                mesh=ax.get("mesh"), module=ax.get("module"), dcp=ax.get("dcp"),
                reshard=ax.get("reshard"), axes=json.dumps(ax), case_outcome=outcome,
                case_status=info.get("status", ""), duration_s=info.get("seconds", 0.0),
                xfail_entry=info.get("xfail_entry"),
                xfail_entries=",".join(map(str, info.get("xfail_entries") or
                                           ([info["xfail_entry"]] if info.get("xfail_entry")
                                            else []))),
                xfail_reason=info.get("xfail_reason", ""),
                skip_reason=info.get("skip_reason", ""), repro=info.get("repro", ""),
                # how its ranks ran: nccl (a GPU each), gloo (CPU, or ranks sharing GPUs)
                pg_backend=info.get("pg_backend", ""),
                ranks_per_gpu=str(info.get("ranks_per_gpu") or ""),
                loss=info.get("loss", ""),  # the training loss (calibration populations)
                config=info.get("config", ""))  # its configuration (Case.numerics)
    rows = [dict(base, phase="", check="case", quantity="", metric="duration_s",
                 value=info.get("seconds", 0.0), tolerance=float("nan"), row_outcome=outcome,
                 detail=info.get("summary", ""))]
    for r in judged_rows(info):
        rows.append(dict(base, phase=r.get("phase", ""), check=r["check"], quantity=r["quantity"],
                         metric=r["metric"], value=r["value"], tolerance=r["tolerance"],
                         row_outcome=r["outcome"], detail=r.get("detail", ""),
                         tolerance_source=r.get("tolerance_source", "")))
    return rows


def judged_rows(info: dict) -> list[dict]:
    """The case's result rows as the verdict has them: coverage rows with their unit's status
    and, for a case with a bug switched on, what its clean twin's entries do not explain."""
    rows = coverage_rows(info.get("rows", []), info.get("coverage") or {})
    if info.get("vs_clean") is not None:  # read by mutation_score
        rows += new_vs_clean_rows(info["vs_clean"])
    return rows


def coverage_rows(rows: list[dict], coverage: dict) -> list[dict]:
    """The rows with each coverage row's status as the verdict has it (``coverage``: unit ->
    (status, why); xfailed where every failure of the unit is explained)."""
    out = []
    for r in rows:
        if r.get("metric") == COVERAGE and r["check"] in coverage:
            status, _ = coverage[r["check"]]
            r = dict(r, outcome=status)
        out.append(r)
    return out


def new_vs_clean_rows(unexplained: list[dict]) -> list[dict]:
    """One ``new_vs_clean`` row per failure of a bug-switched case that its clean twin's xfail
    entries do not explain (``unexplained``: the verdict's against those entries; what
    ``mutation_score`` reads), or one ``clean_twin/*`` row saying there is none (not ``case``:
    those rows are the cases')."""
    nan = float("nan")
    base = dict(metric=NEW_VS_CLEAN, value=nan, tolerance=nan, outcome="info")
    seen, out = set(), []
    for r in unexplained:
        k = (r.get("phase", ""), r["check"], r["quantity"])
        if k not in seen:
            seen.add(k)
            out.append(dict(base, phase=k[0], check=k[1], quantity=k[2],
                            detail="not explained by the clean case's xfail entries"))
    return out or [dict(base, phase="", check=NO_NEW_FAILURE, quantity="*",
                        detail="every failure is one the clean case's xfail entries explain")]
