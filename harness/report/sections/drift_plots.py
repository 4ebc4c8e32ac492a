"""Drift plots: each series' value over the runs against its tolerance, most at risk first."""

from __future__ import annotations

import pandas as pd

from harness.report import drift as drift_mod
from harness.report.context import ReportContext
from harness.report.figures import drift_svg

MAX_PLOTS = 12
MAX_RISK_ROWS = 200


def series_by_risk(ctx: ReportContext, pts: pd.DataFrame) -> pd.DataFrame:
    """The last point of every series, most at risk first (series of latest runs before series
    no longer run); series with the very same points share one row (``twins``: their cases)."""
    key = drift_mod.GROUP_KEY
    last = pts.groupby(key, sort=False).tail(1).copy()
    latest_idx = {(g.hw, g.scenario, g.backend): g.runs[-1] for g in ctx.groups}
    last["current"] = [latest_idx.get((hw, s, b)) == ri for hw, s, b, ri in
                       zip(last["hw"], last["scenario"], last["backend"], last["run_index"])]
    last = last.join(pts.groupby(key, sort=False).size().rename("n_points"), on=key)
    last = last.sort_values(["current", "risk", "flagged", "n_points"],
                            ascending=[False, False, False, False], kind="stable")
    # series with the very same points (cases that differ only in axes that do not change
    # the numbers, e.g. the DCP mode for fp32_parity) share one plot
    sig = pts.assign(_p=pts["run_index"].astype(str) + ":" + pts["value"].map(repr) + ":"
                     + pts["tolerance"].map(repr) + ":" + pts["row_outcome"])
    sig = sig.groupby(key, sort=False)["_p"].agg("|".join)
    last = last.join(sig.rename("sig"), on=key)
    twin_key = ["hw", "scenario", "backend", "check", "quantity", "metric", "sig"]
    twins = last.groupby(twin_key, sort=False)["case_id"].agg(list)
    return last.drop_duplicates(twin_key).join(twins.rename("twins"), on=twin_key)


def drift_plots(ctx: ReportContext) -> dict:
    pts = drift_mod.points(ctx.h.rows, ctx.cfg, bitwise_failures=True)
    out = {"fraction": ctx.cfg.fraction, "zero_floor": drift_mod.ZERO_FLOOR, "figures": [],
           "rest": [], "n_rest": 0, "n_more": 0}
    if pts.empty:
        return out
    last = series_by_risk(ctx, pts)
    multi_hw = last["hw"].nunique() > 1
    grouped = dict(list(pts.groupby(drift_mod.GROUP_KEY, sort=False)))
    for i, r in enumerate(last.head(MAX_PLOTS).itertuples(index=False), start=1):
        s = grouped[tuple(getattr(r, k) for k in drift_mod.GROUP_KEY)].sort_values("run_index")
        out["figures"].append(dict(
            _series(ctx, r), svg=drift_svg(s, ctx.h.runs, ctx.cfg, f"fig{i}-"),
            hw=r.hw if multi_hw else None, n_runs=len(s),
            others=[ctx.case_ref(c, r.hw, r.backend) for c in r.twins[1:]]))
    rest = last.iloc[MAX_PLOTS:]
    shown = rest.head(MAX_RISK_ROWS)
    out.update(rest=[dict(_series(ctx, r), base_median=r.base_median, n_twins=len(r.twins) - 1)
                     for r in shown.itertuples(index=False)],
               n_rest=len(rest), n_more=len(rest) - len(shown))
    return out


def _series(ctx: ReportContext, r) -> dict:
    return {"ref": ctx.case_ref(r.case_id, r.hw, r.backend), "check": r.check,
            "quantity": r.quantity, "metric": r.metric, "value": r.value,
            "tolerance": r.tolerance, "risk": r.risk, "flagged": bool(r.flagged),
            "reason": r.reason, "current": bool(r.current)}
