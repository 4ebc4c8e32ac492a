"""Synthetic results histories for the report / drift / goldens tests (no torchrun involved)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from harness.results import write as results
from harness.results.case_rows import case_rows

T0 = datetime(2026, 1, 1, 2, 0, tzinfo=timezone.utc)
AXES = ("recipe", "mesh", "module", "dcp", "reshard")


def case_id(scenario: str, ax: dict) -> str:
    return f"{scenario}[{'-'.join(str(v) for v in ax.values())}]"


def make_case(ax: dict, outcome: str = "passed", metrics: dict | None = None, *,
              scenario: str = "synth", trace=None, xfail_entry=None, xfail_reason="",
              skip_reason="", summary=None, status="ok", seconds=1.0,
              coverage: dict | None = None) -> dict:
    """A case as the plugin hands it to ``results.case_rows.case_rows``.

    ``metrics``: {(check, quantity, metric): value | (value, tolerance[, row_outcome, detail])}.
    ``coverage``: {check: status | (status, reason)}, the coverage rows (schema 2).
    """
    rows = []
    for (check, qty, metric), v in (metrics or {}).items():
        v = v if isinstance(v, tuple) else (v, 1e-4)
        value, tol = v[0], v[1]
        out = v[2] if len(v) > 2 else ("pass" if value <= tol else "fail")
        detail = v[3] if len(v) > 3 else f"{metric}={value:g} (tol {tol:g})"
        rows.append(dict(phase="train", check=check, quantity=qty, metric=metric, value=value,
                         tolerance=tol, outcome=out, detail=detail))
    for i, v in enumerate(trace or []):
        rows.append(dict(phase="train", check="trace", quantity="loss", metric=f"step{i}",
                         value=v, tolerance=float("nan"), outcome="info", detail=""))
    rows += coverage_rows(coverage or {})
    cid = case_id(scenario, ax)
    return dict(case_id=cid, scenario=scenario, axes=dict(ax), status=status, seconds=seconds,
                xfail_entry=xfail_entry, xfail_reason=xfail_reason, skip_reason=skip_reason,
                summary=summary if summary is not None else
                ("all checks passed" if outcome == "passed" else outcome),
                repro=f"pytest --scenario {scenario} -k '{cid}'", rows=rows, outcome=outcome)


def write_run(report_dir: Path, n: int, cases: list[dict], *, device="cpu", gpu="",
              backend="torch", torch_version="2.13.0", te_version="", registry="",
              scenarios=None, run_id=None, wall_s=40.0, overhead_s=20.0,
              rank_start=None) -> Path:
    """Run number ``n`` (dated T0 + n hours) -> its parquet file under report_dir/history."""
    run_id = run_id or f"run{n:03d}-{device}{gpu.replace(' ', '')}"
    date = (T0 + timedelta(hours=n)).isoformat()
    meta = dict(schema_version=results.SCHEMA_VERSION, date=date, git_sha=f"sha{n:04d}",
                torch_version=torch_version, torch_build=torch_version, te_version=te_version,
                hostname="ci-1", device=device, backend=backend, gpu_name=gpu, run_id=run_id,
                scenarios=scenarios or sorted({c["scenario"] for c in cases}), wall_s=wall_s,
                launches=[dict(name="L001", worker="", world_size=2, tasks=len(cases),
                               wall_s=wall_s * 0.9, overhead_s=overhead_s, returncode=0,
                               timed_out=False)],
                launch_overhead_s=overhead_s, registry=str(registry))
    if rank_start:
        meta["rank_start"] = rank_start
    rows = []
    for c in cases:
        info = dict(c, run_id=run_id, backend=backend, device=device)
        rows += case_rows(info, c["outcome"])
    df = results.frame(rows, meta)
    return results.write_run(report_dir, run_id, df, meta)["parquet"]


def coverage_rows(coverage: dict) -> list[dict]:
    """Coverage rows as the worker writes them: metric "coverage", quantity "*", NaN values."""
    rows = []
    for check, v in coverage.items():
        status, detail = v if isinstance(v, tuple) else (v, "")
        rows.append(dict(phase="", check=check, quantity="*", metric="coverage",
                         value=float("nan"), tolerance=float("nan"), outcome=status,
                         detail=detail))
    return rows


@pytest.fixture
def report_dir(tmp_path) -> Path:
    d = tmp_path / "reports"
    (d / "history").mkdir(parents=True)
    return d


STEADY = ("fp32_parity", "loss", "max_abs")
DRIFT = ("fp32_parity", "params", "rel_l2")
CROSS = ("fp32_parity", "grads", "max_abs")
A = dict(recipe="fp32", mesh="dp2", module="Linear", dcp="sync", reshard="none")
B = dict(recipe="bf16", mesh="dp2", module="Linear", dcp="sync", reshard="none")
C = dict(recipe="bf16", mesh="dp4", module="Linear", dcp="sync", reshard="none")
D = dict(recipe="fp32", mesh="dp4", module="LayerNormMLP", dcp="sync", reshard="none")  # new
E = dict(recipe="fp32", mesh="dp2", module="LayerNormMLP", dcp="sync", reshard="none")  # removed
DRIFT_RUN, CROSS_RUN, LAST_RUN = 5, 6, 7


def drifting_history(report_dir: Path, runs: int = LAST_RUN + 1, drift: bool = True,
                     extra_last: list | None = None, last_coverage=None, **last_kw) -> list[str]:
    """8 runs: A steady; B's rel_l2 jumps 10x at run 5; C's max_abs crosses 0.5 x tolerance at
    run 6 (3x growth, below the growth factor); D appears at run 7, E disappears at run 7.
    ``drift=False``: everything steady. ``extra_last`` cases (and ``last_kw`` write_run
    arguments) go into the last run; ``last_coverage(case) -> {check: status}`` adds coverage
    rows to the cases of the last run."""
    ids = []
    for n in range(runs):
        b = 1e-5 if drift and n >= DRIFT_RUN else 1e-6
        c = 6e-5 if drift and n >= CROSS_RUN else 2e-5
        cases = [make_case(A, metrics={STEADY: 1e-6, DRIFT: 2e-6, ("dcp_roundtrip", "state",
                                                                   "n_diff"): (0.0, 0.0)},
                           trace=[1.0, 0.9, 0.8]),
                 make_case(B, metrics={DRIFT: b}, trace=[1.1, 1.0, 0.95]),
                 make_case(C, metrics={CROSS: c})]
        if n < LAST_RUN:
            cases.append(make_case(E, metrics={STEADY: 3e-6}))
        if n == LAST_RUN:
            cases.append(make_case(D, metrics={STEADY: 5e-6}))
        last = n == runs - 1
        if last:
            cases += extra_last or []
            for c in cases if last_coverage else []:
                c["rows"] = c["rows"] + coverage_rows(last_coverage(c))
        ids.append(write_run(report_dir, n, cases, **(last_kw if last else {})).stem)
    return ids


REGISTRY = """\
entries:
  - match: {scenario: fixver, fixes: no_tp_dtensor_params}
    fails: {check: reshard}
    reason: TP params lose their DTensor placement on load
    details: measured 12/40 elements differing after a dp2xtp2 -> dp4 reshard
    link: https://example.org/issue/1
  - match: {scenario: synth, module: MultiheadAttention}
    fails: {check: fp32_parity}
    reason: claims a failure that no longer happens
  - match: {scenario: synth, module: TransformerLayer}
    fails: {check: fp32_parity}
    reason: matches nothing any more
  - match: {scenario: synth, backend: te}
    fails: {check: fp32_parity}
    reason: a scenario / backend never run in this history
"""
FIX_AX = dict(recipe="fp32", mesh="dp2xtp2", module="Linear", dcp="sync", reshard="to_dp4")


NOT_LOADED = "not run: needs the dcp load, which failed: CheckpointException: rank 1 missing"
NO_TARGET = "not run: reshard=none (no target mesh)"


def synth_coverage(case: dict) -> dict:
    """The coverage rows of a case of rich_history's last run. Holes: reshard never runs in
    scenario synth (reshard=none), weights_only_load never runs with recipe bf16 (its dcp load
    fails); with fp32 it ran once. The "case" unit has a coverage row too, like the worker's."""
    ax, out = case["axes"], case["outcome"]
    if out == "skipped":
        return {}  # never launched: no coverage rows
    parity = "failed" if out == "failed" else "passed"
    cov = {"case": "passed", "fp32_parity": parity, "dcp_roundtrip": "passed",
           "reshard": ("not_run", NO_TARGET) if ax["reshard"] == "none" else "passed"}
    if case["scenario"] == "synth":
        ran = ax["recipe"] == "fp32" and ax["module"] == "Linear"
        cov["weights_only_load"] = "passed" if ran else ("not_run", NOT_LOADED)
    elif ax.get("fixes") == "no_tp_dtensor_params":
        cov["reshard"] = ("xfailed", "xfail entry 1")
    elif ax.get("fixes") == "no_weights_only_pickle":
        cov["weights_only_load"] = ("failed", "UnpicklingError: weights only")
    return cov


def rich_history(report_dir: Path, coverage: bool = True) -> Path:
    """drifting_history + every outcome, a fix-verification scenario, a registry, a bad file;
    coverage rows in the last run (``coverage=False``: none, as before schema 2).
    Returns the registry path."""
    reg = report_dir / "xfails.yaml"
    reg.write_text(REGISTRY)
    tol = 1e-4
    extra = [
        make_case(dict(A, module="LayerNormLinear"), "failed", {
            ("fp32_parity", "loss", "max_abs"): (3e-3, tol, "fail",
                                                 "max_abs=0.003 (tol 0.0001) at step 2")},
            summary="fp32_parity/loss failed"),
        make_case(dict(A, module="MultiheadAttention"), "xpassed", {STEADY: 1e-6},
                  xfail_entry=2, xfail_reason="xfail entry 2 (xfails.yaml line 6): claims a "
                                              "failure that no longer happens"),
        make_case(dict(A, mesh="hsdp2x1xtp2"), "skipped",
                  skip_reason="needs 4 ranks, --max-world-size 2"),
    ]
    fixes = [
        make_case(dict(FIX_AX, fixes="all"), "passed", {DRIFT: 1e-6}, scenario="fixver"),
        make_case(dict(FIX_AX, fixes="no_tp_dtensor_params"), "xfailed", {
            ("reshard", "state", "n_diff"): (12.0, 0.0, "fail", "12/40 elements differ")},
            scenario="fixver", xfail_entry=1,
            xfail_reason="xfail entry 1 (xfails.yaml line 2): TP params lose their DTensor "
                         "placement on load"),
        make_case(dict(FIX_AX, fixes="no_quantized_allgather"), "passed", {DRIFT: 1e-6},
                  scenario="fixver"),
        make_case(dict(FIX_AX, fixes="no_weights_only_pickle"), "failed", {
            ("weights_only_load", "error", "exception"): (1.0, 0.0, "error",
                                                          "UnpicklingError: weights only")},
            scenario="fixver", status="error"),
    ]
    drifting_history(report_dir, extra_last=extra + fixes, registry=reg,
                     scenarios=["synth", "fixver"],
                     last_coverage=synth_coverage if coverage else None)
    (report_dir / "history" / "broken.parquet").write_bytes(b"not parquet at all")
    return reg
