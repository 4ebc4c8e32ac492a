"""Tolerance drift: does a metric creep towards its tolerance before it fails?

A *series* is one (scenario, backend, case, check, quantity, metric) on one *hardware key*
(device, GPU model, backend); its points are the values of that row over the runs of the history,
oldest first. Only rows with a finite tolerance > 0 are series: bitwise rows (tolerance 0) are
either 0 or already a failure, so there is nothing to drift.

For each (hardware, scenario, backend) the latest run is compared with a rolling baseline: the
median of the previous ``baseline_runs`` points of the same series on the same hardware. A point
is flagged when

* **growth**: ``value > growth * baseline`` and ``value > min_value`` -- the metric jumped, even
  if still far below its tolerance (a new kernel, an extra rounding step, a lost fp32 accumulate);
* **fraction**: ``value >= fraction * tolerance`` while the baseline was below it -- it crossed
  into the upper part of its tolerance band, before it actually fails.

Series that are not bit-reproducible run to run (a baseline that changed twice or more) are
judged as a group instead, by the group's median growth (``drift_noise.py``).

Defaults and their reasoning (also in ``docs/report.md`` and ``python -m harness drift -h``):

* ``baseline_runs = 5``: the median of 5 ignores up to 2 outlier runs (a noisy GPU, a flaky
  node) and is a working week of nightlies. A persistent step change stays flagged until 3 of the
  5 baseline runs carry it, then becomes the new normal.
* ``growth = 4.0``: 4x is two binary orders of magnitude -- a real change in numerics rather
  than noise where a series repeats run to run (CPU runs, and most GPU recipes, are bit for bit
  reproducible, so any growth is real there); a series that is not (TE DelayedScaling was, until
  its builds started from fresh amax histories) varies by far more than that from run to run,
  and its group's median judges it.
* ``fraction = 0.5``: still passing with 2x headroom, so there is time to investigate before the
  nightly goes red; tolerances are set a few times above the observed error, so healthy series
  sit well below half of theirs.
* ``min_value = 1e-12``: an absolute floor for the growth rule, so 0 -> 1e-15 (denormals, a
  reordered reduction of tiny values) is not called a jump; any error a float32 or bf16 computation
  makes on O(1) values is many orders of magnitude larger.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness.report import drift_noise
from harness.report.history import History, file_date

SERIES_KEY = ["scenario", "backend", "case_id", "check", "quantity", "metric"]
GROUP_KEY = ["hw"] + SERIES_KEY
RUN_GROUP = ["hw", "scenario", "backend"]
NON_METRIC_CHECKS = ("case", "trace")
ZERO_FLOOR = 1e-12  # where zeros are drawn on a log axis


@dataclass(frozen=True)
class DriftConfig:
    baseline_runs: int = 5
    growth: float = 4.0
    fraction: float = 0.5
    min_value: float = 1e-12

    def describe(self) -> str:
        return (f"baseline = median of the previous {self.baseline_runs} run(s) on the same "
                f"hardware; flag growth > {self.growth:g}x (above {self.min_value:g}) or crossing "
                f"{self.fraction:g} x tolerance")


@dataclass
class DriftResult:
    config: DriftConfig
    latest: pd.DataFrame  # every evaluated point of the latest run of each run group
    flags: pd.DataFrame  # the flagged subset, most at risk first
    groups: pd.DataFrame  # one row per (hw, scenario, backend): latest run, baseline runs
    notes: list[str] = field(default_factory=list)
    new_series: pd.DataFrame | None = None
    removed_series: pd.DataFrame | None = None

    @property
    def flagged(self) -> bool:
        return not self.flags.empty


def points(rows: pd.DataFrame, cfg: DriftConfig = DriftConfig(), *,
           bitwise_failures: bool = False) -> pd.DataFrame:
    """One row per (series, run) with the rolling baseline and the flags of that point.

    ``bitwise_failures`` also keeps tolerance-0 series that failed at least once (for plots).
    """
    # case / trace rows carry no verdict; "error/exception" rows mark a crash, not a metric
    df = rows[~rows["check"].isin(NON_METRIC_CHECKS) & (rows["metric"] != "exception")]
    df = df[np.isfinite(df["value"].to_numpy(dtype=float))]
    tol = df["tolerance"].to_numpy(dtype=float)
    keep = np.isfinite(tol) & (tol > 0)
    if bitwise_failures:
        bad = df["row_outcome"].isin(["fail", "error"])
        ever = bad.groupby([df[c] for c in GROUP_KEY]).transform("any")
        keep |= (np.isfinite(tol) & (tol == 0) & ever.to_numpy())
    cols = GROUP_KEY + ["run_index", "run_id", "value", "tolerance", "row_outcome", "detail",
                        "recipe", "mesh", "module"]
    df = df.loc[keep, cols]
    if df.empty:
        f, b = pd.Series(dtype=float), pd.Series(dtype=bool)
        return df.assign(base_median=f, base_n=pd.Series(dtype=int), risk=f, growth_flag=b,
                         fraction_flag=b, flagged=b, reason=pd.Series(dtype=object),
                         base_changes=pd.Series(dtype=int), noisy=b, group_growth=f,
                         own_growth=f)
    # one point per series and run (the largest value if a run repeats a row)
    df = df.sort_values(["run_index", "value"], kind="stable")
    df = df.drop_duplicates(GROUP_KEY + ["run_index"], keep="last")
    df = df.sort_values(GROUP_KEY + ["run_index"], kind="stable").reset_index(drop=True)
    n = max(int(cfg.baseline_runs), 1)
    g = df.groupby(GROUP_KEY, sort=False)["value"]
    lags = np.column_stack([g.shift(k).to_numpy(dtype=float) for k in range(1, n + 1)])
    df["base_n"] = np.isfinite(lags).sum(axis=1).astype(int)
    df["base_changes"] = drift_noise.changes(lags)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: no baseline
        df["base_median"] = np.nanmedian(lags, axis=1)
    v, t, b = df["value"], df["tolerance"], df["base_median"]
    with np.errstate(divide="ignore", invalid="ignore"):
        df["risk"] = np.where(t > 0, v / t, np.where(v > 0, np.inf, 0.0))
    has_base = df["base_n"] >= 1
    df["growth_flag"] = has_base & (v > cfg.min_value) & (v > cfg.growth * b) & (t > 0)
    df["fraction_flag"] = has_base & (t > 0) & (v >= cfg.fraction * t) & (b < cfg.fraction * t)
    df = drift_noise.judge_groups(df, cfg.growth, cfg.min_value)
    df["flagged"] = df["growth_flag"] | df["fraction_flag"]
    df["reason"] = [drift_noise.reason(own, grp) if noisy and gf else
                    _reason(gf, ff, val, base, tl, cfg) for gf, ff, val, base, tl, noisy, grp, own
                    in zip(df["growth_flag"], df["fraction_flag"], v, b, t, df["noisy"],
                           df["group_growth"], df["own_growth"])]
    return df


def _reason(growth: bool, frac: bool, v: float, base: float, tol: float, cfg) -> str:
    out = []
    if growth:
        out.append(f"grew {v / base:.3g}x over baseline" if base > 0 else
                   "grew from 0")
    if frac:
        out.append(f"crossed {cfg.fraction:g} x tolerance ({v / tol:.2f} of tolerance)")
    return "; ".join(out)


def unusable_latest(h: History) -> str | None:
    """Why the newest history file cannot be judged, or None.

    A history file that cannot be used (corrupt, truncated, a failed page checksum, an unknown
    schema) and is at least as new as the latest readable run means the latest run is not
    known: judging the run before it would report on the wrong run and pass. Duplicates of a
    readable run and non-parquet files do not count."""
    latest = h.runs["date_ts"].max() if not h.empty else pd.NaT
    for path, why in h.problems:
        if Path(path).suffix != ".parquet" or why.startswith("duplicate of run"):
            continue
        date = file_date(Path(path))
        if latest is pd.NaT or date is pd.NaT or pd.isna(latest) or date >= latest:
            return (f"{path}: {why}; it is at least as new as the latest readable run "
                    f"({h.latest['run_id'] if not h.empty else 'none'}), so the latest run "
                    f"cannot be judged (repair or remove the file, or pass --at RUN_ID)")
    return None


def run_groups(h: History, upto: int | None = None) -> pd.DataFrame:
    """Per (hardware, scenario, backend): the runs containing it, latest last."""
    rows = h.rows if upto is None else h.rows[h.rows["run_index"] <= upto]
    if rows.empty:
        return pd.DataFrame(columns=RUN_GROUP + ["runs", "latest", "previous"])
    g = rows.groupby(RUN_GROUP, sort=True)["run_index"].unique()
    out = g.reset_index().rename(columns={"run_index": "runs"})
    out["runs"] = [sorted(int(x) for x in r) for r in out["runs"]]
    out["latest"] = [r[-1] for r in out["runs"]]
    out["previous"] = [r[-2] if len(r) > 1 else -1 for r in out["runs"]]
    return out


def detect(h: History, cfg: DriftConfig = DriftConfig(), at: str | None = None) -> DriftResult:
    """Flag drift in the latest run of each (hardware, scenario, backend) group.

    ``at`` (a run id) evaluates the history as it was right after that run.
    """
    upto = None
    if at is not None:
        idx = h.runs.loc[h.runs["run_id"] == at, "run_index"]
        if idx.empty:
            raise KeyError(f"run {at!r} is not in the history")
        upto = int(idx.iloc[0])
    rows = h.rows if upto is None else h.rows[h.rows["run_index"] <= upto]
    groups = run_groups(h, upto)
    pts = points(rows, cfg)
    notes: list[str] = []
    if groups.empty:
        empty = pts.iloc[0:0]
        return DriftResult(cfg, empty, empty, groups, ["history is empty"])
    latest_idx = {tuple(k): li for k, li in
                  zip(groups[RUN_GROUP].itertuples(index=False), groups["latest"])}
    key = list(zip(pts["hw"], pts["scenario"], pts["backend"]))
    is_latest = np.array([latest_idx.get(k) == ri for k, ri in zip(key, pts["run_index"])],
                         dtype=bool)
    latest = pts[is_latest].copy()
    # series seen in the group before but absent from its latest run
    last_seen = pts.groupby(GROUP_KEY, sort=False)["run_index"].max().reset_index()
    last_seen["group_latest"] = [latest_idx.get(k) for k in
                                 zip(last_seen["hw"], last_seen["scenario"], last_seen["backend"])]
    removed = last_seen[last_seen["run_index"] < last_seen["group_latest"]]
    judged = {tuple(k) for k, r in zip(groups[RUN_GROUP].itertuples(index=False), groups["runs"])
              if len(r) > 1}
    in_judged = np.array([k in judged for k in
                          zip(latest["hw"], latest["scenario"], latest["backend"])], dtype=bool)
    new = latest[(latest["base_n"] == 0) & in_judged]
    for hw, sc, be, runs in groups[RUN_GROUP + ["runs"]].itertuples(index=False):
        lat = h.runs.iloc[runs[-1]]["run_id"]
        nb = min(len(runs) - 1, cfg.baseline_runs)
        if nb < 1:
            notes.append(f"{sc} ({be}) on {hw}: run {lat} is its first run on this hardware -- "
                         f"no baseline yet, nothing flagged")
    if len(new):
        notes.append(f"{len(new)} series have no earlier point (new cases or checks): not judged")
    if len(removed):
        notes.append(f"{len(removed)} series of earlier runs are not in the latest run "
                     f"(removed cases or checks)")
    flags = latest.loc[latest["flagged"].astype(bool)]
    flags = flags.sort_values("risk", ascending=False, kind="stable")
    latest = latest.sort_values("risk", ascending=False, kind="stable")
    groups = groups.assign(latest_run=[h.runs.iloc[r[-1]]["run_id"] for r in groups["runs"]],
                           baseline_runs=[min(len(r) - 1, cfg.baseline_runs)
                                          for r in groups["runs"]])
    return DriftResult(cfg, latest, flags, groups, notes, new, removed)


def _fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}"


def format_flags(res: DriftResult) -> str:
    """A plain-text table of the flagged series."""
    if res.flags.empty:
        return "no drift flagged"
    head = ["hardware", "case", "check/quantity/metric", "baseline median (n)", "latest",
            "tolerance", "latest/tol", "reason"]
    lines = [head]
    for r in res.flags.itertuples(index=False):
        lines.append([r.hw, r.case_id, f"{r.check}/{r.quantity}/{r.metric}",
                      f"{_fmt(r.base_median)} ({r.base_n})", _fmt(r.value), _fmt(r.tolerance),
                      _fmt(r.risk), r.reason])
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(head) - 1)]
    out = []
    for row in lines:
        out.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
    return "\n".join(out)
