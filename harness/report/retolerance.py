"""Recorded rows judged against the tolerances as they are now (``python -m harness rejudge
--tolerances``): every calibrated quantity's max_abs / rel_l2 row gets the tolerance its
population has in ``harness/calibration/measured.csv`` today and passes or fails by it -- what a
recalibration does to runs already made, without making them again (before -> after).

The population comes from the row (backend, device, process groups -- inferred as
``derive.pg_backend`` does where a history predates the column -- the case mesh's world size
and its reshard's target, the module) and the loss it trained with (recorded; a catalog
module's where a row predates the column). A scenario's own ``tolerances`` overrides are not in
the history: a row of such a scenario is judged by the calibration like any other. A row whose loss is not known (an older
row of a scenario's own model) keeps its recorded tolerance and outcome."""

from __future__ import annotations

import math

import pandas as pd

from harness.calibration import derive, tolerances
from harness.spec.mesh import parse_mesh

METRICS = ("max_abs", "rel_l2")


def _tolerance(r, measured, loss: str) -> float:
    """Today's tolerance of row ``r``'s metric for its population and ``loss`` (NaN: none)."""
    where = tolerances.Population(r.backend, r.device,
                                  derive.pg_backend(r.device, getattr(r, "pg_backend", None)),
                                  parse_mesh(r.mesh).world_size, r.module,
                                  derive.target_world(getattr(r, "reshard", None)),
                                  r.config or "")
    try:
        t = tolerances.lookup(r.check, r.quantity, r.recipe, loss=loss, where=where,
                              measured=measured)
    except tolerances.MissingTolerance:
        return math.nan
    return t.max_abs if r.metric == "max_abs" else t.rel_l2


def _within(values, tols) -> bool:
    return all(math.isfinite(v) and v <= t for v, t in zip(values, tols))


def apply(rows: pd.DataFrame, measured: dict | None = None) -> tuple[pd.DataFrame, int]:
    """``rows`` with the calibrated comparisons' tolerance and outcome as today's calibration
    gives them, and how many comparisons changed outcome. A comparison (its max_abs and rel_l2
    rows) passes when both are within their tolerance; one that failed for another reason than
    its numbers (a shape mismatch, replicas that diverge: it failed within its recorded
    tolerance) keeps its recorded outcome."""
    rows = rows.reset_index(drop=True)  # row labels must be unique (concatenated histories)
    rows = rows.assign(config=derive.configs(rows))  # as recorded, else its scenario's
    pick = rows["metric"].isin(METRICS) & pd.Series(
        [(c, q) in derive.CALIBRATED for c, q in zip(rows["check"], rows["quantity"])],
        index=rows.index)
    if "tolerance_source" in rows:  # judged bitwise (no population judges it): kept as is
        pick &= rows["tolerance_source"].fillna("") != "bitwise"
    changed = 0
    keys = ["run_id", "case_id", "phase", "check", "quantity"]
    for _, g in rows[pick].groupby(keys, sort=False):
        values = [float(v) for v in g["value"]]
        was_pass = bool((g["row_outcome"] == "pass").all())
        if was_pass != _within(values, [float(t) for t in g["tolerance"]]):
            continue  # not a numbers-only outcome: keep it
        first = g.iloc[0]
        loss = derive.loss_of(first["module"], first.get("loss"))
        if loss is None:
            continue  # not known which loss's population judges it: keep it
        tols = [_tolerance(r, measured, loss) for r in g.itertuples()]
        now = "pass" if _within(values, tols) else "fail"  # a NaN tolerance fails
        changed += now != ("pass" if was_pass else "fail")
        rows.loc[g.index, "tolerance"] = tols
        rows.loc[g.index, "row_outcome"] = now
    return rows, changed
