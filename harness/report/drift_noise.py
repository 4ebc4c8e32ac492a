"""Drift of series that are not bit-reproducible run to run, judged as a group.

A series whose value changes from run to run with the code unchanged (TE DelayedScaling under
FSDP2 did until its builds started from fresh amax histories: docs/findings.md) cannot be judged point by point: its values spread over its whole
tolerance band by construction (a calibrated tolerance is 2x the p99 or max of a population
that holds that noise), so "grew 4x over the baseline median" and "crossed half the tolerance" fire
on noise -- 49-89 of one recipe's series a run, in runs of one commit. What drifts there is the
distribution: a new kernel or an extra rounding moves every series of the recipe's quantity at
once. So:

* a series is **noisy** where its baseline changed at least ``NOISY_CHANGES`` times between
  consecutive runs (a single step -- a code change -- is one change, and keeps the point rules);
* a (hardware, scenario, backend, recipe, check, quantity, metric) group whose noisy series are
  more than half of those with a baseline that long is judged as a group, every series of it:
  a point is flagged when the group's median of value / baseline median grew beyond the growth
  factor and the point's own ratio did too (it moved with its group); the fraction rule does
  not apply there.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

NOISE_GROUP = ["hw", "scenario", "backend", "recipe", "check", "quantity", "metric", "run_index"]
NOISY_CHANGES = 2  # baseline changes between consecutive runs that make a series noisy


def changes(lags: np.ndarray) -> np.ndarray:
    """Per row of ``lags`` (the previous points, most recent first): how often consecutive
    baseline points differ."""
    out = np.zeros(len(lags), dtype=int)
    for k in range(lags.shape[1] - 1):
        a, b = lags[:, k], lags[:, k + 1]
        out += np.isfinite(a) & np.isfinite(b) & (a != b)
    return out


def judge_groups(df: pd.DataFrame, growth: float, min_value: float) -> pd.DataFrame:
    """``df`` (drift.points' rows with ``base_changes``) with the series of noisy groups judged
    as a group: ``noisy``, ``group_growth`` (the group's median of value / baseline median),
    ``own_growth`` (the point's) and their flags replaced."""
    long_enough = df["base_n"] >= NOISY_CHANGES + 1
    noisy = (df["base_changes"] >= NOISY_CHANGES).where(long_enough)
    key = [df[c] for c in NOISE_GROUP]
    share = noisy.astype(float).groupby(key).transform("mean")
    in_noisy = (share > 0.5).fillna(False).astype(bool) & (df["base_n"] >= 1)
    v, b = df["value"].to_numpy(dtype=float), df["base_median"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = pd.Series(np.where(b > 0, v / b, np.where(v > min_value, np.inf, 1.0)),
                          index=df.index)
    group = ratio.where(in_noisy).groupby(key).transform("median")
    flag = in_noisy & (group > growth) & (ratio > growth) & (df["value"] > min_value)
    df = df.assign(noisy=in_noisy, group_growth=group.where(in_noisy),
                   own_growth=ratio.where(in_noisy))
    df.loc[in_noisy, "growth_flag"] = flag[in_noisy]
    df.loc[in_noisy, "fraction_flag"] = False
    return df


def reason(row_ratio: float, group: float) -> str:
    return (f"its group (not bit-reproducible run to run) grew {group:.3g}x, this series "
            f"{row_ratio:.3g}x")
