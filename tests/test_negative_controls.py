"""Negative controls: every check can fail, and a hang / crash costs one case, not the run.

Runs real torchrun launches (2 and 4 ranks, gloo) through the scheduler, one batch for all
faults, and asserts on each case's result.
"""

from pathlib import Path

import pytest
from forked import rank_server

from harness.launch.launcher import Launcher
from harness.launch.scheduler import Scheduler
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario

TEST_SCENARIOS = Path(__file__).resolve().parent / "scenarios"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    spec = load_scenario(TEST_SCENARIOS / "negative_controls.yaml")
    cases = expand(spec, "torch")
    root = tmp_path_factory.mktemp("neg")
    # the hang and the case after it in a lane of their own: its timeout overlaps the rest
    after_hang = {"fault": "none", "dcp": "async_thread", "reshard": "none", "mesh": "dp2"}
    hang = lambda c: c.ax["fault"] == "hang" or after_hang.items() <= c.ax.items()  # noqa: E731
    with rank_server("torch") as server:
        launcher = Launcher(root / "launches", "torch", "cpu", rank_server=server)
        with Scheduler(launcher, cases, root / "ckpt",
                       scope_of=lambda c: "hang" if hang(c) else "all") as sched:
            results = {c.ax["fault"] + ":" + c.ax["reshard"] + ":" + c.ax["dcp"]
                       + ("" if c.ax["mesh"] == "dp2" else ":" + c.ax["mesh"]): sched.result(c)
                       for c in cases}
    return results, launcher


def _failed(res):
    return {(r["phase"], r["check"], r["quantity"]) for r in res.failed_rows}


def test_perturbed_reference_fails_fp32_parity_only(outcome):
    res = outcome[0]["perturb_reference:none:sync"]
    assert res.status == "ok"
    failed = _failed(res)
    assert ("train", "fp32_parity", "params") in failed
    assert all(check == "fp32_parity" for _, check, _ in failed)
    row = next(r for r in res.failed_rows if r["quantity"] == "params" and r["metric"] == "max_abs")
    assert "first:" in row["detail"] and "rel_l2=" in row["detail"]


def test_perturbed_load_fails_roundtrip_and_reshard(outcome):
    res = outcome[0]["perturb_loaded:to_dp4:sync"]
    assert res.status == "ok"
    failed = _failed(res)
    assert ("train", "dcp_roundtrip", "state") in failed
    assert ("reshard", "reshard", "state") in failed
    assert not any(check == "fp32_parity" for _, check, _ in failed)
    row = next(r for r in res.failed_rows
               if (r["check"], r["quantity"], r["metric"]) == ("dcp_roundtrip", "state", "n_diff"))
    assert row["value"] == 1  # exactly the one perturbed element
    assert "[0]" in row["detail"] or "[0, 0]" in row["detail"]


def test_skipped_load_fails_roundtrip(outcome):
    res = outcome[0]["skip_load:none:async_thread"]
    failed = _failed(res)
    assert ("train", "dcp_roundtrip", "state") in failed
    assert ("train", "dcp_roundtrip", "next_loss") in failed
    # the checkpoint itself is fine: async == sync
    assert not any(check == "async_equivalence" for _, check, _ in failed)


def test_hang_times_out_with_stacks_and_next_case_passes(outcome):
    results, _ = outcome
    res = results["hang:none:sync"]
    assert res.status == "timeout"
    assert "timed out after 15.5 s (case timeout_s)" in res.errors[0]  # as given, not "16s"
    assert "faults.py" in res.stacks and "at_case_start" in res.stacks  # rank 1's sleeping frame
    nxt = results["none:none:async_thread"]
    assert nxt.passed, nxt.errors


def test_crash_is_blamed_on_its_case(outcome):
    res = outcome[0]["crash:none:sync"]
    assert res.status == "crash"
    assert "launch died" in res.errors[0]
    assert any("rank 1" in k for k in res.logs)


def _coverage(res):
    return {r["check"]: (r["outcome"], r["detail"]) for r in res.rows if r["metric"] == "coverage"}


def test_one_rank_raising_is_recorded_and_the_rest_is_not_run(outcome):
    """Rank 0 raises while the others train on: the main group is out of step (rank 1 waits
    in a collective until it times out), so the case records the failure, marks every other
    unit not run with the reason, and the ranks exit for a re-launch (the next case passes)."""
    res = outcome[0]["raise:none:sync"]
    assert res.status == "ok"
    rows = [r for r in res.failed_rows if r["check"] == "train"]
    row = next(r for r in rows if "injected fault" in r["detail"])
    assert row["metric"] == "exception" and "injected fault: rank 0 raises" in row["detail"]
    assert "faults.py" in row["traceback"] and row["rank"] == 0
    cov = _coverage(res)
    assert cov["train"][0] == "failed"
    for unit in ("reference", "save", "load", "fp32_parity", "dcp_roundtrip"):
        assert cov[unit][0] == "not_run", unit
        assert "the process group is out of step after train failed" in cov[unit][1]


def test_a_raising_check_does_not_stop_independent_checks(outcome):
    res = outcome[0]["check_raises:none:async_thread"]
    assert res.status == "ok"
    assert {r["check"] for r in res.failed_rows} == {"fp32_parity"}
    cov = _coverage(res)
    assert cov["fp32_parity"][0] == "failed" and "raised: RuntimeError" in cov["fp32_parity"][1]
    for later in ("async_equivalence", "dcp_roundtrip"):
        assert cov[later][0] == "passed", later
    assert {r["quantity"] for r in res.rows if r["check"] == "dcp_roundtrip"} >= \
        {"state", "next_loss", "next_params"}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    spec = load_scenario(TEST_SCENARIOS / "negative_controls_reference.yaml")
    cases = expand(spec, "reference")
    root = tmp_path_factory.mktemp("negq")
    with rank_server("reference") as server, \
            Scheduler(Launcher(root / "launches", "reference", "cpu", rank_server=server),
                      cases, root / "ckpt") as sched:
        return {f'{c.ax["fault"]}:{c.ax["fixes"]}': sched.result(c) for c in cases}


def test_a_buffer_lost_on_load_fails_the_roundtrip(quantized):
    """Every raw buffer of a quantized tensor is compared after a load: the columnwise MXFP8
    copy that the load dropped is named, although the rowwise values are intact."""
    res = quantized["drop_columnwise_on_load:all"]
    assert res.status == "ok"
    [row] = [r for r in res.failed_rows if (r["check"], r["quantity"], r["metric"])
             == ("dcp_roundtrip", "state", "n_diff")]
    assert "missing model.fc1_weight#col_data" in row["detail"]
    assert "missing model.fc1_weight#col_scale" in row["detail"]
    assert quantized["none:all"].passed, quantized["none:all"].failed_rows


def test_bytes_on_the_wire_name_parameter_dtype_and_bytes(quantized):
    """Without FSDP2's all-gather hooks the quantized weights travel as float32 values: the
    check names each parameter, the dtype and the bytes it moved."""
    bad = quantized["none:no_quantized_allgather"]
    [row] = [r for r in bad.failed_rows if r["quantity"] == "bytes_on_wire"]
    assert "fc1_weight: float32 x 4096 = 16384 B for 4096 elements (4 B/element)" in row["detail"]
    assert "dequantized values on the wire" in row["detail"]
    good = {(r["quantity"], r["metric"]): r for r in quantized["none:all"].rows
            if r["check"] == "quantized_allgather_parity"}
    verdict = good[("bytes_on_wire", "violations")]
    assert verdict["outcome"] == "pass"
    # an explicit unshard gathers both usages (rowwise + columnwise MXFP8: 1 B + 1/32 B each)
    assert "fc1_weight: uint8 x 4096 = 4096 B, uint8 x 128 = 128 B, uint8 x 4096 = 4096 B, " \
           "uint8 x 128 = 128 B for 4096 elements (2.06 B/element)" in verdict["detail"]
    assert good[("bytes_on_wire", "bytes_per_element")]["value"] == 8448 / 4096


@pytest.mark.parametrize("mesh", ["hsdp2x2", "dp2xtp2"])
def test_a_diverged_replica_fails_naming_parameter_and_ranks(outcome, mesh):
    """HSDP replicas and TP-replicated weights must hold the same bytes on every rank: the
    gather names the parameter and the two ranks whose copies differ."""
    res = outcome[0][f"diverge_replica:none:sync:{mesh}"]
    rows = [r for r in res.failed_rows if (r["check"], r["quantity"], r["metric"])
            == ("fp32_parity", "params", "max_abs")]
    assert rows and "#replicas_diverge(ranks " in rows[0]["detail"], (res.status, res.errors,
                                                                   res.failed_rows)
    assert " vs 3 at offset " in rows[0]["detail"]  # rank 3 (the last) holds the odd copy


@pytest.mark.parametrize("fault, what", [("export_nan", "non-finite: "),
                                         ("export_wrong", "first: ")])
def test_safetensors_export_fails_on_a_planted_defect(outcome, fault, what):
    res = outcome[0][f"{fault}:none:sync"]
    failed = {(r["check"], r["quantity"]) for r in res.failed_rows}
    assert ("safetensors_export", "vs_state") in failed, res.failed_rows
    row = next(r for r in res.failed_rows if r["quantity"] == "vs_state")
    assert what in row["detail"]
    assert {c for c, _ in failed} == {"safetensors_export"}  # nothing else is affected


def test_async_checkpoint_with_other_bytes_fails_async_equivalence(outcome):
    res = outcome[0]["async_differs:none:async_thread"]
    failed = {(r["check"], r["quantity"]) for r in res.failed_rows}
    assert {("async_equivalence", "bytes"), ("async_equivalence", "isolation")} <= failed
    row = next(r for r in res.failed_rows if r["quantity"] == "bytes" and r["metric"] == "n_diff")
    assert row["value"] == 2  # exactly the two elements that changed (one in each rank's shard)


@pytest.mark.parametrize("fix, check, quantity, what", [
    ("no_optimizer_dtensor_state", "optimizer_state_placement", "dtensor_states", "plain tensor"),
    ("no_weights_only_pickle", "weights_only_load", "error", "Weights only load failed"),
])
def test_each_quantized_check_fails_on_its_bug(quantized, fix, check, quantity, what):
    res = quantized[f"none:{fix}"]
    rows = [r for r in res.failed_rows if (r["check"], r["quantity"]) == (check, quantity)]
    assert rows and what in rows[0]["detail"], res.failed_rows


def test_clean_cases_pass_after_faults(outcome):
    results, launcher = outcome
    res = results["none:to_dp4:sync"]
    assert res.passed, (res.errors, res.failed_rows)
    export = {r["quantity"] for r in res.rows if r["check"] == "safetensors_export"}
    assert export >= {"fp32_dtypes", "vs_state"}
    assert {r["phase"] for r in res.rows} == {"train", "reshard"}
    # relaunches happened (hang, crash, raise) but the hung launch was bounded by its case's
    # timeout (a lane's launch that runs many cases may take longer on a loaded host)
    hung = [r for r in launcher.records if r.timed_out]
    assert hung and all(r.wall_s < 120 for r in hung), [(r.name, r.wall_s) for r in hung]
