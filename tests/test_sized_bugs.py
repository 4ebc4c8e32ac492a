"""Every calibrated tolerance is tight enough to catch a bug of realistic size, on every recipe
of the reference backend (tests/scenarios/sized_bugs.yaml; tolerances from
harness/calibration/measured.csv)."""

from pathlib import Path

import pytest

from harness.launch.launcher import Launcher
from harness.launch.scheduler import Scheduler
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario

pytestmark = pytest.mark.integration
RECIPES = ["fp32", "bf16", "delayed", "current", "block", "mxfp8", "nvfp4"]
SCENARIO = Path(__file__).resolve().parent / "scenarios" / "sized_bugs.yaml"


@pytest.fixture(scope="module")
def sized(tmp_path_factory):
    cases = expand(load_scenario(SCENARIO), "reference")
    root = tmp_path_factory.mktemp("sized")
    with Scheduler(Launcher(root / "launches", "reference", "cpu"), cases,
                   root / "ckpt") as sched:
        return {(c.recipe, c.ax["fault"]): sched.result(c) for c in cases}


def _rows(res, check, quantity):
    return {r["metric"]: r for r in res.rows
            if (r["check"], r["quantity"]) == (check, quantity) and r["metric"] != "coverage"}


def _fails(res, check, quantity) -> bool:
    rows = _rows(res, check, quantity)
    assert rows, f"no {check}/{quantity} rows"
    return any(r["outcome"] == "fail" for r in rows.values())


@pytest.mark.parametrize("recipe", RECIPES)
def test_clean_case_passes(sized, recipe):
    res = sized[(recipe, "none")]
    assert res.passed, [(r["check"], r["quantity"], r["detail"]) for r in res.failed_rows]


@pytest.mark.parametrize("fault", ["lr_scale_1.5", "lr_scale_0.67"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_a_wrong_learning_rate_fails_update_norms(sized, recipe, fault):
    """Adam's step size is set by the learning rate whatever a format's gradient noise: the
    parameters' update norms show a 1.5x / 0.67x step at once."""
    res = sized[(recipe, fault)]
    assert res.status == "ok"
    assert _fails(res, "fp32_parity", "update_norms"), _rows(res, "fp32_parity", "update_norms")
    rel = _rows(res, "fp32_parity", "update_norms")["rel_l2"]
    assert rel["value"] > 10 * rel["tolerance"]  # not a near miss


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_wrong_scale_fails_loss_and_grads(sized, recipe):
    res = sized[(recipe, "wrong_scale")]
    assert _fails(res, "fp32_parity", "loss") and _fails(res, "fp32_parity", "grads")


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_dropped_optimizer_state_fails_the_reshard_next_step(sized, recipe):
    res = sized[(recipe, "drop_exp_avg")]
    assert _fails(res, "reshard", "next_params"), _rows(res, "reshard", "next_params")
    assert _fails(res, "dcp_roundtrip", "state")  # bitwise, of course
