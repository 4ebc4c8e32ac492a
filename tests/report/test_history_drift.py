"""History loading / validation and drift detection on synthetic histories."""

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from synth_history import (
    CROSS,
    CROSS_RUN,
    DRIFT,
    DRIFT_RUN,
    STEADY,
    A,
    B,
    C,
    D,
    E,
    case_id,
    drifting_history,  # noqa: F401
    make_case,
    write_run,
)

from harness.__main__ import main
from harness.report import drift, history
from harness.results import write as results


def _series(res, ax, key):
    cid = case_id("synth", ax)
    f = res.flags
    return f[(f["case_id"] == cid) & (f["check"] == key[0]) & (f["quantity"] == key[1])
             & (f["metric"] == key[2])]


# ---------------------------------------------------------------------------- history ---
def test_history_orders_by_date_and_joins_meta(report_dir):
    # file names sort the other way round from the dates
    write_run(report_dir, 2, [make_case(A, metrics={STEADY: 1e-6})], run_id="a-late")
    write_run(report_dir, 1, [make_case(A, metrics={STEADY: 2e-6})], run_id="z-early")
    h = history.load(report_dir / "history")
    assert h.problems == []
    assert list(h.runs["run_id"]) == ["z-early", "a-late"]
    assert list(h.runs["run_index"]) == [0, 1]
    assert h.latest["run_id"] == "a-late"
    assert h.latest["git_sha"] == "sha0002" and h.latest["wall_s"] == 40.0
    assert h.latest["meta"]["launches"][0]["name"] == "L001"
    r = h.rows
    assert set(r["hw"]) == {"cpu/-/torch"}
    assert r.loc[r["run_id"] == "z-early", "run_index"].eq(0).all()
    assert str(r["xfail_entry"].dtype) == "Int64" and r["value"].dtype == "float64"


def test_corrupt_and_foreign_files_are_named_and_skipped(report_dir):
    hist = report_dir / "history"
    good = write_run(report_dir, 0, [make_case(A, metrics={STEADY: 1e-6})])
    (hist / "corrupt.parquet").write_bytes(b"PAR1 this is not really parquet")
    truncated = hist / "truncated.parquet"
    truncated.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    pd.DataFrame({"x": [1, 2]}).to_parquet(hist / "foreign.parquet")
    (hist / "notes.txt").write_text("hello")
    # a future schema version
    t = pq.read_table(good)
    md = dict(t.schema.metadata)
    meta = json.loads(md[results.META_KEY])
    pq.write_table(t.replace_schema_metadata(
        {**md, results.META_KEY: json.dumps({**meta, "schema_version": 99,
                                             "run_id": "v99"}).encode()}),
        hist / "future.parquet")
    # a required column missing
    pq.write_table(t.drop(["tolerance"]).replace_schema_metadata(
        {**md, results.META_KEY: json.dumps({**meta, "run_id": "nocol"}).encode()}),
        hist / "nocol.parquet")
    # a required column of the wrong type
    bad = t.set_column(t.schema.get_field_index("value"), "value",
                       pa.array(["x"] * t.num_rows))
    pq.write_table(bad.replace_schema_metadata(md), hist / "badtype.parquet")
    # the same run copied in twice (merging runners' directories)
    (hist / "copy.parquet").write_bytes(good.read_bytes())

    h = history.load(hist)
    assert list(h.runs["run_id"]) == [good.stem]
    why = {p.name: r for p, r in h.problems}
    dup = "copy.parquet" if "copy.parquet" in why else good.name  # the second one read
    assert set(why) == {"corrupt.parquet", "truncated.parquet", "foreign.parquet", "notes.txt",
                        "future.parquet", "nocol.parquet", "badtype.parquet", dup}
    assert "not a readable parquet" in why["corrupt.parquet"]
    assert "foreign" in why["foreign.parquet"]
    assert "schema_version 99" in why["future.parquet"]
    assert "tolerance" in why["nocol.parquet"]
    assert "'value'" in why["badtype.parquet"]
    assert "duplicate of run" in why[dup]
    assert "not a .parquet" in why["notes.txt"]


def test_empty_history(report_dir, capsys):
    h = history.load(report_dir / "history")
    assert h.empty and h.rows.empty
    assert main(["drift", "--history", str(report_dir / "history")]) == 2
    assert main(["report", "--history", str(report_dir / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


# ------------------------------------------------------------------------------ drift ---
def test_drift_flags_the_right_run(report_dir):
    ids = drifting_history(report_dir)
    h = history.load(report_dir / "history")
    for n, rid in enumerate(ids):
        res = drift.detect(h, at=rid)
        # the steady metric is never flagged
        assert _series(res, A, STEADY).empty
        growth = _series(res, B, DRIFT)
        cross = _series(res, C, CROSS)
        # B jumps 10x at DRIFT_RUN; flagged from then until 3 of 5 baseline runs carry the step
        assert (not growth.empty) == (DRIFT_RUN <= n < DRIFT_RUN + 3), n
        # C crosses 0.5 x tolerance at CROSS_RUN (only 3x growth: the fraction rule)
        assert (not cross.empty) == (CROSS_RUN <= n < CROSS_RUN + 3), n
        if n == DRIFT_RUN:
            r = growth.iloc[0]
            assert r["growth_flag"] and not r["fraction_flag"]
            assert r["base_median"] == pytest.approx(1e-6) and r["base_n"] == 5
            assert "grew 10x" in r["reason"]
            assert len(res.flags) == 1
        if n == CROSS_RUN:
            r = cross.iloc[0]
            assert r["fraction_flag"] and not r["growth_flag"]
            assert "crossed 0.5 x tolerance" in r["reason"]
    # the last run: D is new (not judged), E removed; bitwise rows are not series
    res = drift.detect(h)
    assert set(res.new_series["case_id"]) == {case_id("synth", D)}
    assert set(res.removed_series["case_id"]) == {case_id("synth", E)}
    assert not (res.latest["check"] == "dcp_roundtrip").any()
    assert any("new cases" in n for n in res.notes)
    assert any("not in the latest run" in n for n in res.notes)


def test_drift_single_run_and_config(report_dir):
    drifting_history(report_dir, runs=1)
    h = history.load(report_dir / "history")
    res = drift.detect(h)
    assert res.flags.empty
    assert any("no baseline" in n for n in res.notes)
    # options: a growth factor above the 10x jump and a fraction above 0.6 flag nothing
    drifting_history(report_dir)
    h = history.load(report_dir / "history")
    cfg = drift.DriftConfig(baseline_runs=3, growth=20, fraction=0.9)
    assert drift.detect(h, cfg, at=h.runs["run_id"].iloc[CROSS_RUN]).flags.empty
    cfg = drift.DriftConfig(baseline_runs=1)  # baseline = the previous run only
    res = drift.detect(h, cfg, at=h.runs["run_id"].iloc[DRIFT_RUN + 1])
    assert _series(res, B, DRIFT).empty  # the step is already the baseline


def test_drift_min_value_and_zero_baseline(report_dir):
    for n, (tiny, real) in enumerate([(0.0, 0.0)] * 3 + [(1e-15, 1e-9)]):
        write_run(report_dir, n, [make_case(A, metrics={STEADY: tiny, DRIFT: real})])
    h = history.load(report_dir / "history")
    res = drift.detect(h)
    assert _series(res, A, STEADY).empty  # 0 -> 1e-15: below min_value
    r = _series(res, A, DRIFT)
    assert len(r) == 1 and r.iloc[0]["reason"] == "grew from 0"
    assert drift.detect(h, drift.DriftConfig(min_value=1e-8)).flags.empty


def test_drift_baseline_is_per_hardware(report_dir):
    # GPU runs with 100x larger values interleaved with CPU runs: neither side is flagged
    for n in range(6):
        write_run(report_dir, 2 * n, [make_case(A, metrics={STEADY: 1e-7})])
        write_run(report_dir, 2 * n + 1, [make_case(A, metrics={STEADY: 1e-5})], device="cuda",
                  gpu="NVIDIA H100 80GB HBM3")
    h = history.load(report_dir / "history")
    res = drift.detect(h)
    assert res.flags.empty
    assert set(res.latest["hw"]) == {"cpu/-/torch", "cuda/NVIDIA H100 80GB HBM3/torch"}
    assert (res.latest["base_n"] == 5).all()


def test_drift_nan_tolerance_and_values(report_dir):
    nan = float("nan")
    for n in range(3):
        write_run(report_dir, n, [make_case(A, metrics={
            STEADY: (1e-6, nan, "pass"), DRIFT: (nan, 1e-4, "error"), CROSS: 1e-6})])
    h = history.load(report_dir / "history")
    res = drift.detect(h)
    assert set(res.latest["quantity"]) == {"grads"} and res.flags.empty


def test_drift_cli_fail_on_drift(report_dir, tmp_path, capsys):
    drifting_history(report_dir)
    hist = str(report_dir / "history")
    at = history.load(report_dir / "history").runs["run_id"].iloc[DRIFT_RUN]
    assert main(["drift", "--history", hist, "--at", at]) == 0  # report only
    assert main(["drift", "--history", hist, "--at", at, "--fail-on-drift"]) == 1
    out = capsys.readouterr().out
    assert case_id("synth", B) in out and "fp32_parity/params/rel_l2" in out and "grew 10x" in out
    steady = tmp_path / "steady"
    (steady / "history").mkdir(parents=True)
    drifting_history(steady, drift=False)
    assert main(["drift", "--history", str(steady / "history"), "--fail-on-drift"]) == 0
    assert "no drift flagged" in capsys.readouterr().out
    assert main(["drift", "--history", hist, "--at", "nope"]) == 2


def test_help_documents_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["drift", "--help"])
    out = capsys.readouterr().out
    for text in ("--baseline-runs 5", "--growth 4.0", "--fraction 0.5", "--min-value 1e-12",
                 "--fail-on-drift"):
        assert text in out
