"""Measured errors from history rows of the ``calibration`` scenario.

Only units that ran and whose failures are not registered bugs count: a row of a unit whose
coverage is ``xfailed`` (a known failure explains it) or ``not_run`` is left out, so a known bug
never widens a tolerance. Everything else counts, passing or not -- that is what calibration is
for. p99 is numpy's linear-interpolated 99th percentile over all cases of all sources of one
loss (``catalog.TASK_LOSS`` of the case's module): MSE layers and next-token models apart.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.spec import catalog

CALIBRATED = {("fp32_parity", "loss"), ("fp32_parity", "grads"), ("fp32_parity", "params"),
              ("fp32_parity", "stored_params"), ("fp32_parity", "update_norms"),
              ("reshard", "next_loss"),
              ("reshard", "next_params")}
METRICS = ("max_abs", "rel_l2")


def measured(df: pd.DataFrame) -> list[dict]:
    df = df[df["scenario"] == "calibration"]
    cov = df[df["metric"] == "coverage"]
    excluded = set(zip(cov.loc[cov["row_outcome"].isin(["xfailed", "not_run"]), "case_id"],
                       cov.loc[cov["row_outcome"].isin(["xfailed", "not_run"]), "check"]))
    rows = df[df["metric"].isin(METRICS) & df["row_outcome"].isin(["pass", "fail"])]
    if "pg_backend" in rows:  # ranks that shared GPUs (gloo on cuda) never pool with nccl runs
        rows = rows[~((rows["device"] == "cuda") & (rows["pg_backend"] == "gloo"))]
    keep = [(c, q) in CALIBRATED and (cid, c) not in excluded
            for cid, c, q in zip(rows["case_id"], rows["check"], rows["quantity"])]
    rows = rows[keep]
    rows = rows.assign(loss=[catalog.TASK_LOSS[catalog.MODULE_TASKS[m]]
                             if m in catalog.MODULE_TASKS else None for m in rows["module"]])
    rows = rows[rows["loss"].notna()]  # a module the catalog does not know: no population
    out = []
    if rows.empty:
        return out
    for (check, quantity, recipe, loss, metric), g in rows.groupby(
            ["check", "quantity", "recipe", "loss", "metric"]):
        values = g["value"].to_numpy(dtype=float)
        sources = g.groupby(["backend", "device"]).size()
        out.append(dict(check=check, quantity=quantity, recipe=recipe, loss=loss, metric=metric,
                        n=len(values), p99=float(np.percentile(values, 99)),
                        max=float(values.max()),
                        sources=" ".join(f"{b}/{d}:{n}" for (b, d), n in sources.items())))
    return out
