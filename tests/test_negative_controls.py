"""Negative controls: every check can fail, and a hang / crash costs one case, not the run.

Runs real torchrun launches (2 and 4 ranks, gloo) through the scheduler, one batch for all
faults, and asserts on each case's result.
"""

from pathlib import Path

import pytest

from harness.launcher import Launcher
from harness.matrix import expand
from harness.scheduler import Scheduler
from harness.spec import load_scenario

TEST_SCENARIOS = Path(__file__).resolve().parent / "scenarios"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    spec = load_scenario(TEST_SCENARIOS / "negative_controls.yaml")
    cases = expand(spec, "torch")
    root = tmp_path_factory.mktemp("neg")
    launcher = Launcher(root / "launches", "torch", "cpu")
    sched = Scheduler(launcher, cases, root / "ckpt")
    results = {c.ax["fault"] + ":" + c.ax["reshard"] + ":" + c.ax["dcp"]: sched.result(c) for c in cases}
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
    assert "timed out after 15s" in res.errors[0]
    assert "faults.py" in res.stacks and "at_case_start" in res.stacks  # rank 1's sleeping frame
    nxt = results["none:none:async_thread"]
    assert nxt.passed, nxt.errors


def test_crash_is_blamed_on_its_case(outcome):
    res = outcome[0]["crash:none:sync"]
    assert res.status == "crash"
    assert "launch died" in res.errors[0]
    assert any("rank 1" in k for k in res.logs)


def test_raise_is_an_error_with_traceback(outcome):
    res = outcome[0]["raise:none:sync"]
    assert res.status == "error"
    assert any("injected fault: rank 0 raises" in e for e in res.errors)


def test_clean_cases_pass_after_faults(outcome):
    results, launcher = outcome
    res = results["none:to_dp4:sync"]
    assert res.passed, (res.errors, res.failed_rows)
    assert {r["phase"] for r in res.rows} == {"train", "reshard"}
    # relaunches happened (hang, crash, raise) but every launch was bounded
    assert all(r.wall_s < 120 for r in launcher.records)
