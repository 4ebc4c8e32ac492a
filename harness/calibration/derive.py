"""Measured errors from history rows of the ``calibration`` scenario, per population.

A population is where the numbers were measured: the backend, the device, the process groups'
backend (``nccl`` with a GPU per rank, ``gloo`` on CPU or where ranks share GPUs), the
configuration (``Case.numerics``: dims, steps, lr), the world size and the module. Populations
never pool backends, devices, process-group kinds, configurations or world sizes (a world's
reduction order is its own: pooled over worlds, a 4-rank twin was judged by the 2-rank twin's
bit-exact zeros); each measurement is written at two levels -- (module, world size) and the
world size over all modules -- and the lookup takes the finer with at least ``MIN_N``
samples.

The reshard check's world is the reshard's: source -> target world size (``2->4``), never pooled
over (``levels``). Its next step is bit-exact where both meshes sum the same ranks' gradients
(dp2 <-> hsdp2x1: 0 in every TE run) and off by a float32 reduction order, amplified by a
quantized format, where they do not (2 -> 4 ranks: rel-L2 up to 2.6e-4 bf16, 9.7e-3
Float8CurrentScaling): pooled by the source's world alone, a 2 -> 2 reshard was judged by the
2 -> 4 spread -- wide enough to pass a bug that moved it by 7.8e-3 (te_mutations'
no_to_copy_keeps_subclass on ranks sharing a GPU).

Only passing runs count: a calibration case whose every other check passed (round trips bit
for bit, nothing crashed) and whose units no registered failure explains (coverage ``xfailed``
/ ``not_run``) -- a known bug, or a broken case, never widens a tolerance. Its calibrated
quantities count whether or not they passed the tolerance the run was judged by: that is the
previous calibration, which a new kind of case (a new module, mesh or reshard) has no
population in yet. ``python -m harness calibrate`` prints such rows (``beyond_previous``) for
review: a change of the numerics shows there before it enters a tolerance. A training counts
once: the train-phase rows a case carries from another case's train task (a shared train
phase, harness/launch/task_graph.py) are that case's sample, not a second one. Samples taken
before a change of what the harness measures (``SUPERSEDED``) count in no population.
p99 is numpy's linear-interpolated 99th percentile, per loss (``catalog.TASK_LOSS``
of the case's module: MSE layers and next-token models apart).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from harness.calibration import twin
from harness.spec import catalog
from harness.spec.matrix import numerics_of, reshard_target
from harness.spec.mesh import parse_mesh
from harness.spec.scenario import load_scenario

if TYPE_CHECKING:  # pandas and numpy load where used: pytest's plugin imports this module
    import pandas as pd

SCENARIOS = ("calibration", twin.SCENARIO)  # the scenarios measured here
ON_DEMAND = "calibration_on_demand"  # + "@<config>": a run's calibration on demand (on_demand.py)
SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"  # where their files are
CALIBRATED = {("fp32_parity", "loss"), ("fp32_parity", "grads"), ("fp32_parity", "params"),
              ("fp32_parity", "stored_params"), ("fp32_parity", "update_norms"),
              ("reshard", "next_loss"),
              ("reshard", "next_params")} | {(twin.CHECK, q) for q in twin.QUANTITIES}
METRICS = ("max_abs", "rel_l2")
UNJUDGED = "unjudged"  # a row measured without a tolerance for its configuration: a sample
MIN_N = 10  # fewer samples than this: the population is too small to take a p99 from
# a population of this many samples or more bounds by its largest sample, not its p99: errors
# of parameters trained under Adam are heavy-tailed (an element whose gradient is near rounding
# noise moves by a step's size), and the p99 of 100 is their second largest (docs/checks.md)
TAIL_N = 100
ANY = "*"  # a population column pooled over
# population columns, and the levels written (the columns each keeps; the rest pooled)
POPULATION = ("backend", "device", "pg_backend", "config", "world_size", "module")
# the configuration (Case.numerics: dims, steps, lr) is never pooled over: a population
# measured at one configuration is no tolerance for another
LEVELS = (("config", "module", "world_size"), ("config", "world_size"))
EDGE_CHECKS = ("reshard",)  # checks whose world is the reshard's (source -> target)
# samples the harness no longer measures the same way -- (backend, recipe, checks, measured
# before (UTC, ISO), why) -- left out of every population
SUPERSEDED = (("te", "delayed", (twin.CHECK, "fp32_parity"), "2026-11-29T04:30:00+00:00",
               "TE's random init amax stayed in the build's amax histories: the first scale "
               "update used it, and the twin and the sharded run moved run to run "
               "(backends/te_fresh_amax.py)"),
              ("te", "delayed", (twin.CHECK,), "2026-11-30T00:20:00+00:00",
               "the DelayedScaling twin ran the global batch in one forward, other GEMM shapes "
               "than a rank's: it runs each slice as a micro-batch now (te_global_state)"),)


def levels(check: str) -> tuple[tuple[str, ...], ...]:
    """The levels a check's measurements are written and looked up at (every one keeps the
    world size; a reshard's is its source -> target)."""
    return LEVELS


def world(check: str, world_size: int, target: int | None) -> str:
    """A population's world: the case mesh's size; the reshard check's: ``source->target``."""
    return f"{world_size}->{target}" if check in EDGE_CHECKS and target else str(world_size)


def target_world(reshard) -> int | None:
    """The world size a row's reshard axis (``to_<mesh>`` / ``none``) loads onto."""
    t = reshard_target(reshard)
    return t.world_size if t else None


def pg_backend(device: str, recorded) -> str:
    """The process groups' backend of a row: recorded since shared GPUs exist; before, every
    CPU run was gloo and every GPU run nccl (a GPU per rank)."""
    if isinstance(recorded, str) and recorded:
        return recorded
    return "nccl" if device == "cuda" else "gloo"


def loss_of(module: str, recorded=None) -> str | None:
    """The training loss of a row: as recorded (the ``loss`` column, since it exists), else
    that of a catalog module (``catalog.TASK_LOSS``); None: neither (an older row of a
    scenario's own model)."""
    if isinstance(recorded, str) and recorded:
        return recorded
    task = catalog.MODULE_TASKS.get(module)
    return catalog.TASK_LOSS[task] if task is not None else None


def run_cases(df: pd.DataFrame) -> list[tuple[str, str]]:
    """(run, case) of every row: what a case did in one run says nothing of the same case in
    another run (another host, process-group kind or day); rows without a run id (hand-made
    frames) are one run."""
    runs = df["run_id"].fillna("") if "run_id" in df else [""] * len(df)
    return list(zip(runs, df["case_id"]))


def carried(rows: pd.DataFrame, history: pd.DataFrame) -> pd.Series:
    """Which of ``rows`` a case carries from another case's train task: the train-phase rows of
    the cases ``history`` gives a shared_train_phase note in that run
    (harness/launch/task_graph.py) or a mode_group one (a further DCP mode of a group,
    worker/mode_group.py) -- that training's rows, which the case that ran it has too."""
    import pandas as pd
    notes = history["quantity"].isin([catalog.SHARED_TRAIN_PHASE, catalog.MODE_GROUP]) & \
        (history["metric"] == "note")
    shared = set(run_cases(history[notes]))
    if not shared:  # (rows of old histories may have no phase column)
        return pd.Series(False, index=rows.index)
    return pd.Series([rc in shared for rc in run_cases(rows)], index=rows.index) \
        & (rows["phase"] == "train")


def configs(df: pd.DataFrame, scenario_dir: Path = SCENARIO_DIR) -> list[str]:
    """Each row's configuration (Case.numerics): as recorded (the ``config`` column, since it
    exists), else that of its case in the scenario file it ran from (its axes and backend)."""
    import pandas as pd
    none = pd.Series([None] * len(df), index=df.index)
    recorded = df["config"] if "config" in df else none
    specs, seen, out = {}, {}, []
    for rec, scen, backend, axes in zip(recorded, df["scenario"], df["backend"],
                                        df["axes"] if "axes" in df else none):
        if isinstance(rec, str) and rec:
            out.append(rec)
            continue
        if (scen, backend, axes) not in seen:
            if scen not in specs:
                path = Path(scenario_dir) / f"{scen}.yaml"
                try:
                    specs[scen] = load_scenario(path) if path.is_file() else None
                except ValueError:  # a scenario file that no longer loads: no config known
                    specs[scen] = None
            spec = specs[scen]
            known = spec is not None and isinstance(axes, str)
            seen[(scen, backend, axes)] = (numerics_of(spec, backend, json.loads(axes))
                                           if known else None)
        out.append(seen[(scen, backend, axes)])
    return out


def measured_at(df: pd.DataFrame) -> pd.Series:
    """When each row was measured (UTC): its ``date``, else its run id's timestamp (run ids
    begin ``%Y%m%dT%H%M%S``: a run's calibration on demand carries no date); NaT: neither."""
    import pandas as pd
    def parse(values, **kw):
        return pd.Series(pd.to_datetime(values, utc=True, errors="coerce", **kw),
                         index=df.index)
    none = pd.Series(pd.NaT, index=df.index, dtype="datetime64[ns, UTC]")
    dates = parse(df["date"]) if "date" in df else none
    if "run_id" in df:
        runs = parse(df["run_id"].astype("string").str.slice(0, 15), format="%Y%m%dT%H%M%S")
        dates = dates.fillna(runs)
    return dates


def superseded(df: pd.DataFrame, rules=SUPERSEDED) -> pd.Series:
    """Which rows a ``SUPERSEDED`` rule leaves out: its backend, recipe and checks, measured
    before its date (:func:`measured_at`; a row with no time known: before every rule)."""
    import pandas as pd
    out = pd.Series(False, index=df.index)
    when = measured_at(df)
    for backend, recipe, checks, before, _ in rules:
        old = when.isna() | (when < pd.Timestamp(before))
        out |= (df["backend"] == backend) & (df["recipe"] == recipe) & \
            df["check"].isin(checks) & old
    return out


def is_calibration(scenario) -> bool:
    """A scenario measured here: the calibration scenarios, or a run's calibration on demand."""
    return scenario in SCENARIOS or str(scenario).startswith(ON_DEMAND + "@")


BROKEN_STATUS = ("error", "timeout", "crash")  # a unit that raised, a launch that crashed
UNREAD_COLUMNS = ("repro", "duration_s", "detail")  # what ``measured`` never reads


def packaged(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of a calibration history that ``measured`` reads, and only its columns -- what
    a run's history is slimmed to before it joins ``reports/calibration/`` (``python -m harness
    calibrate --package``): the samples (max_abs / rel_l2), the coverage rows of units left out
    (xfailed, not run), any other failure, the rows of crashed cases and the notes that name a
    shared train phase. ``measured`` gives the same from it as from the whole history."""
    import pandas as pd
    df = df[[is_calibration(s) for s in df["scenario"]]]
    status = df["case_status"] if "case_status" in df else pd.Series("", index=df.index)
    keep = df["metric"].isin(METRICS) | status.isin(BROKEN_STATUS) \
        | ((df["metric"] == "coverage") & df["row_outcome"].isin(["xfailed", "not_run"])) \
        | ((df["metric"] != "coverage") & (df["row_outcome"] == "fail")) \
        | ((df["quantity"] == catalog.SHARED_TRAIN_PHASE) & (df["metric"] == "note"))
    return df[keep].drop(columns=[c for c in UNREAD_COLUMNS if c in df]).reset_index(drop=True)


def measured(df: pd.DataFrame, scenario_dir: Path = SCENARIO_DIR) -> list[dict]:
    import numpy as np
    df = df[[is_calibration(s) for s in df["scenario"]]]
    # a row once: a history read twice (a run's own and its packaged copy, which lacks only
    # UNREAD_COLUMNS) or a file that holds a run's rows twice must not count a sample twice
    df = df.drop_duplicates(subset=[c for c in df.columns if c not in UNREAD_COLUMNS])
    # a case's run left out, or one of its checks, is left out in that run only: a case that
    # hung on one host must not take its samples of every other run with it
    cov = df[df["metric"] == "coverage"]
    bad = cov[cov["row_outcome"].isin(["xfailed", "not_run"])]
    excluded = set(zip(run_cases(bad), bad["check"]))
    failed = df[(df["row_outcome"] == "fail") & (df["metric"] != "coverage")]
    broken = {rc for rc, c, q in zip(run_cases(failed), failed["check"], failed["quantity"])
              if (c, q) not in CALIBRATED}
    if "case_status" in df:  # a unit that raised, a launch that crashed or timed out
        broken |= set(run_cases(df[df["case_status"].isin(BROKEN_STATUS)]))
    rows = df[df["metric"].isin(METRICS) & df["row_outcome"].isin(["pass", "fail", UNJUDGED])]
    rows = rows[~carried(rows, df) & ~superseded(rows)]  # one sample per training
    keep = [(c, q) in CALIBRATED and (rc, c) not in excluded and rc not in broken
            for rc, c, q in zip(run_cases(rows), rows["check"], rows["quantity"])]
    rows = rows[np.asarray(keep, dtype=bool)]  # (a list would select columns when empty)
    recorded = rows["loss"] if "loss" in rows else [None] * len(rows)
    rows = rows.assign(loss=[loss_of(m, r) for m, r in zip(rows["module"], recorded)])
    rows = rows[rows["loss"].notna()]  # no loss known: no population
    if rows.empty:
        return []
    rows = rows.assign(config=configs(rows, scenario_dir))
    rows = rows[rows["config"].notna()]  # its case is no longer in its scenario: no config
    if rows.empty:
        return []
    recorded = rows["pg_backend"] if "pg_backend" in rows else [None] * len(rows)
    judged = rows["tolerance"].notna() if "tolerance" in rows else False
    reshards = rows["reshard"] if "reshard" in rows else [None] * len(rows)
    rows = rows.assign(
        judged=judged,  # failed against a tolerance of its run (not: none existed yet)
        pg_backend=[pg_backend(d, p) for d, p in zip(rows["device"], recorded)],
        world_size=[world(c, parse_mesh(m).world_size, target_world(r)) for c, m, r
                    in zip(rows["check"], rows["mesh"], reshards)])
    out = []
    base = ["check", "quantity", "recipe", "loss", "metric", "backend", "device", "pg_backend"]
    rows = rows.astype({"config": str})
    for kept in LEVELS:
        pooled = rows[[kept in levels(c) for c in rows["check"]]]
        for key, g in pooled.groupby(base + list(kept)):
            values = g["value"].to_numpy(dtype=float)
            r = dict(zip(base + list(kept), key))
            r.update({c: ANY for c in POPULATION if c not in r})
            out.append(dict(r, n=len(values), p99=float(np.percentile(values, 99)),
                            max=float(values.max()),
                            beyond_previous=int(((g["row_outcome"] == "fail")
                                                 & g["judged"]).sum())))
    return out
