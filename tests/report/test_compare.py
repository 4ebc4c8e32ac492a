"""``python -m harness compare``: two recorded runs, case by case (synthetic histories)."""

from __future__ import annotations

import pytest
from synth_history import case_id, make_case, write_run

from harness.__main__ import main

FAIL = ("fp32_parity", "loss", "max_abs")
SAME = dict(recipe="fp32", mesh="dp2", module="Linear", dcp="sync", reshard="none")
OUTCOME = dict(SAME, module="LayerNormLinear")
ENTRY = dict(SAME, module="MultiheadAttention")
SKIP = dict(SAME, module="TransformerLayer")
ONLY_A = dict(SAME, module="LayerNormMLP")
CRASH = dict(SAME, module="GroupedLinear")
WORLD4 = dict(SAME, mesh="dp2xtp2")
TO_DP4 = dict(SAME, reshard="to_dp4")  # mesh dp2, but its reshard phase takes 4 ranks


def _ran(c: dict, pg: str, n: int) -> dict:
    return dict(c, pg_backend=pg, ranks_per_gpu=n)


def _cases(side: str, identical: bool = False) -> list[dict]:
    """Run A (a GPU per rank, nccl) or B (2 ranks on one GPU, gloo); ``identical``: B's cases
    equal A's (only the process groups differ)."""
    b = side == "b" and not identical
    pg, n = ("gloo", 2) if side == "b" else ("nccl", 1)
    cases = [
        make_case(SAME, metrics={FAIL: 1e-6}),
        make_case(WORLD4, metrics={FAIL: 1e-6}),
        make_case(TO_DP4, metrics={FAIL: 1e-6}),
        make_case(OUTCOME, "failed" if b else "passed",
                  {FAIL: (3e-3, 1e-4) if b else 1e-6}),
        make_case(ENTRY, "xfailed", {FAIL: (3e-3, 1e-4)}, xfail_entry=4 if b else 2,
                  xfail_reason=f"xfail entry {4 if b else 2}"),
        make_case(CRASH, "failed" if b else "passed", None if b else {FAIL: 1e-6},
                  status="timeout" if b else "ok", summary="timed out after 60 s" if b else None),
        make_case(SKIP, "skipped",
                  skip_reason="needs 2 GPUs" if b else "recipe needs sm_90"),
    ]
    if not b:
        cases.append(make_case(ONLY_A, metrics={FAIL: 1e-6}))
    return [_ran(c, pg, n) for c in cases]


def _row(out: str, ax: dict) -> list[str]:
    """The cells of a case's line in the table of differing cases."""
    rows = [ln for ln in out.splitlines() if ln.startswith(f"| {case_id('synth', ax)} |")]
    assert len(rows) == 1, out
    return [c.strip() for c in rows[0].strip("|").split("|")]


def _compare(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["compare", *map(str, argv)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture
def runs(tmp_path):
    a = write_run(tmp_path / "a", 1, _cases("a"), device="cuda", gpu="H200")
    b = write_run(tmp_path / "b", 2, _cases("b"), device="cuda", gpu="H200")
    return a, b


def test_identical_runs_differ_nowhere(tmp_path, capsys):
    a = write_run(tmp_path / "a", 1, _cases("a"), device="cuda")
    b = write_run(tmp_path / "b", 2, _cases("b", identical=True), device="cuda")
    rc, out, _ = _compare(capsys, "--a", a, "--b", b)
    assert rc == 0
    assert "**8 cases in both: 8 same (outcome, entry, skip reason), 0 differ; 0 only in A, " \
           "0 only in B.**" in out
    assert "| nccl, 1 rank/GPU: 8 | gloo, 2 ranks/GPU: 8 |" in out


def test_each_difference_is_reported(runs, tmp_path, capsys):
    out_md = tmp_path / "cmp" / "compare.md"
    rc, out, err = _compare(capsys, "--a", runs[0], "--b", runs[1], "--label-a", "2gpu",
                            "--label-b", "1gpu", "--out", out_md)
    assert rc == 1 and err == ""
    assert "**7 cases in both: 3 same (outcome, entry, skip reason), 4 differ; 1 only in 2gpu, " \
           "0 only in 1gpu.**" in out
    assert _row(out, OUTCOME) == ["synth[fp32-dp2-LayerNormLinear-sync-none]", "outcome",
                                  "passed", "failed", "nccl, 1 rank/GPU", "gloo, 2 ranks/GPU"]
    assert _row(out, ENTRY)[1:4] == ["entry", "entry 2", "entry 4"]
    assert _row(out, SKIP)[1:4] == ["skip_reason", "skip: recipe needs sm_90",
                                    "skip: needs 2 GPUs"]
    assert _row(out, ONLY_A)[1:4] == ["only in 2gpu", "passed", "—"]
    for same in (SAME, WORLD4, TO_DP4):
        assert f"| {case_id('synth', same)} |" not in out
    # the failed case's failing check with its value and tolerance (the entry case has its own)
    assert f"* {case_id('synth', OUTCOME)} (1gpu, failed): fp32_parity/loss/max_abs = 0.003 " \
           "(tolerance 0.0001)" in out
    assert f"* {case_id('synth', CRASH)} (1gpu, failed): no failing check row; the case: timed " \
           "out after 60 s" in out
    crosstab = out.split("## Outcomes")[1].split("##")[0].strip().splitlines()[2:]
    assert crosstab == ["| 2gpu \\ 1gpu | failed | xfailed | skipped | passed |",
                        "|---|---|---|---|---|", "| xfailed | 0 | 1 | 0 | 0 |",
                        "| skipped | 0 | 0 | 1 | 0 |", "| passed | 2 | 0 | 0 | 3 |"]
    assert out_md.read_text() == out


def test_only_world_filters(runs, capsys):
    rc, out, _ = _compare(capsys, "--a", runs[0], "--b", runs[1], "--only-world", "4")
    assert rc == 0
    assert "**2 cases in both: 2 same (outcome, entry, skip reason), 0 differ; 0 only in A, " \
           "0 only in B.**" in out
    rc, out, _ = _compare(capsys, "--a", runs[0], "--b", runs[1], "--only-world", "2")
    assert rc == 1 and "**5 cases in both: 1 same" in out and "1 only in A" in out
    rc, _, err = _compare(capsys, "--a", runs[0], "--b", runs[1], "--only-world", "8")
    assert rc == 2 and err.count("\n") == 1 and "no case of that world size" in err


def test_a_directory_takes_its_newest_run(runs, tmp_path, capsys):
    store = tmp_path / "store"  # names sort the other way round from the runs' dates
    write_run(store, 5, _cases("a"), device="cuda", run_id="aaa-newest")
    write_run(store, 3, _cases("b"), device="cuda", run_id="zzz-older")
    rc, out, _ = _compare(capsys, "--a", runs[0], "--b", store)
    assert rc == 0 and "aaa-newest.parquet" in out and "0 differ" in out
    rc, out, _ = _compare(capsys, "--a", runs[0], "--b", store / "history")  # a bare history
    assert rc == 0 and "aaa-newest.parquet" in out


@pytest.mark.parametrize("what", ["missing", "empty", "not_parquet"])
def test_bad_input_is_one_line_and_exit_2(runs, tmp_path, capsys, what):
    bad = tmp_path / what
    if what == "empty":
        bad.mkdir()
    elif what == "not_parquet":
        bad.write_text("not parquet")
    rc, out, err = _compare(capsys, "--a", runs[0], "--b", bad)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("python -m harness compare: error: --b ")
    assert str(bad) in err
