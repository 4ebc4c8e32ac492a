"""Every calibrated tolerance is tight enough to catch a bug of realistic size, on every recipe
of the reference backend (tests/scenarios/sized_bugs.yaml; tolerances from
harness/calibration/measured.csv)."""

import shutil
from pathlib import Path

import pytest
from forked import rank_server

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
    try:
        with rank_server("reference") as server, \
                Scheduler(Launcher(root / "launches", "reference", "cpu", rank_server=server),
                          cases, root / "ckpt") as sched:
            return {(c.recipe, c.ax["fault"]) + ((c.ax["mesh"],) if c.ax["mesh"] != "dp2"
                                                 else ()): sched.result(c) for c in cases}
    finally:  # the results are in memory; the launches' files are ~300 MB
        shutil.rmtree(root, ignore_errors=True)


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


# (recipe, fault) -> params / stored_params rel-L2 measured vs the calibrated tolerance, where
# the bug passes them (LayerNormMLP 256/512, 2 ranks, CPU; issue 33). Under Adam a quantized
# run's weights already differ from the FP32 run's by rel-L2 0.07-0.17 here; with tolerances
# per population (the reference backend's own LayerNormMLP runs) at 2x their p99, weights that
# never move (0.405-0.411) fail params on every recipe and a 1.5x step (0.227-0.235) on every
# recipe but NVFP4, whose own noise (p99 0.17) leaves it inside -- update_norms catches it
# (test above). Before (3x a p99 pooled over backends): 8 such pairs.
PARAMS_BLIND = {
    ("nvfp4", "lr_scale_1.5"): "params 0.285 / stored 0.295 vs 0.340 / 0.370",
}


def _params_cases():
    for fault in ("lr_scale_1.5", "frozen_weights"):
        for recipe in RECIPES:
            why = PARAMS_BLIND.get((recipe, fault))
            yield pytest.param(recipe, fault, marks=[pytest.mark.xfail(
                strict=True, reason=f"passes the calibrated tolerance: {why}")] if why else [])


@pytest.mark.parametrize("recipe, fault", list(_params_cases()))
def test_a_wrong_update_fails_params_and_stored_params(sized, recipe, fault):
    """A 1.5x learning rate and weight matrices that never move must fail the parameters'
    own comparison (the master weights and, for quantized recipes, the quantized weights),
    not only update_norms. Where the calibrated tolerance is too wide to see them the case is
    a strict xfail with the numbers (PARAMS_BLIND): it turns into an XPASS failure once the
    tolerance can see the bug."""
    res = sized[(recipe, fault)]
    assert res.status == "ok", res.errors
    assert _fails(res, "fp32_parity", "params"), _rows(res, "fp32_parity", "params")
    if recipe not in ("fp32", "bf16"):
        assert _fails(res, "fp32_parity", "stored_params"), _rows(res, "fp32_parity",
                                                                  "stored_params")


@pytest.mark.parametrize("recipe", RECIPES)
def test_weights_that_never_move_fail_update_norms_and_params_updated(sized, recipe):
    res = sized[(recipe, "frozen_weights")]
    assert _fails(res, "fp32_parity", "update_norms")
    row = _rows(res, "fp32_parity", "params_updated")["violations"]
    assert row["outcome"] == "fail" and "did not move during training" in row["detail"]


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_wrong_scale_fails_loss_and_grads(sized, recipe):
    res = sized[(recipe, "wrong_scale")]
    assert _fails(res, "fp32_parity", "loss") and _fails(res, "fp32_parity", "grads")


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_dropped_optimizer_state_fails_the_reshard_next_step(sized, recipe):
    res = sized[(recipe, "drop_exp_avg")]
    assert _fails(res, "reshard", "next_params"), _rows(res, "reshard", "next_params")
    assert _fails(res, "dcp_roundtrip", "state")  # bitwise, of course


# The distributed-only bug: reduced gradients rounded to bf16 (grads_bf16) on the sharded run,
# never on the one-rank twin. Measured (LayerNormMLP 256/512 for current, 2 ranks, CPU):
# fp32_parity passes it on bf16 (params rel-L2 0.00781, the clean case's too) and current
# (0.0852, the clean case's too); sharding_invariance, bitwise, fails it (bf16 params rel-L2
# 1.2e-4, current 3.6e-3).
@pytest.mark.parametrize("recipe", RECIPES)
def test_a_distributed_only_bug_fails_sharding_invariance(sized, recipe):
    clean, res = sized[(recipe, "none")], sized[(recipe, "grads_bf16")]
    assert res.status == "ok", res.errors
    assert _fails(res, "sharding_invariance", "params"), _rows(res, "sharding_invariance", "params")
    assert not _fails(clean, "sharding_invariance", "params")
    print(f"SIZED {recipe} grads_bf16: sharding_invariance params "
          f"{_rows(res, 'sharding_invariance', 'params')['rel_l2']['value']:.3g}, fp32_parity "
          f"params {_rows(res, 'fp32_parity', 'params')['rel_l2']['value']:.3g} vs clean "
          f"{_rows(clean, 'fp32_parity', 'params')['rel_l2']['value']:.3g}")
    if recipe != "fp32":  # fp32's FP32 parity is tight enough to see it too
        for q in ("loss", "grads", "params", "update_norms"):
            assert not _fails(res, "fp32_parity", q), (q, _rows(res, "fp32_parity", q))
    assert not _fails(res, "dcp_roundtrip", "next_params")  # the loaded run has the bug too


# 4 data-parallel slices (hsdp2x2): the twin accumulates them in another order than the
# reduce-scatter / all-reduce, so the check takes its tolerance calibrated from that
# reduction-order noise (scenarios/calibration_invariance.yaml). The first-step gradients --
# reduced, not yet through any quantized weight update -- keep that noise at <= 1.3e-7 rel-L2 on
# every recipe, so they catch the bug everywhere; the final params catch it on every recipe but
# current scaling, whose 4-slice noise has a tail as large as the bug (a flipped FP8 rounding
# grows over the steps: params rel-L2 up to 1.9e-3 on LayerNormMLP, 3.2e-3 on LlamaStack).
@pytest.mark.parametrize("recipe", RECIPES)
def test_a_distributed_only_bug_fails_calibrated_invariance(sized, recipe):
    clean, res = sized[(recipe, "none", "hsdp2x2")], sized[(recipe, "grads_bf16", "hsdp2x2")]
    assert clean.passed, [(r["check"], r["quantity"], r["detail"]) for r in clean.failed_rows]
    for q in ("grads", "params"):
        rows = _rows(res, "sharding_invariance", q)
        assert rows["rel_l2"]["tolerance"] > 0, rows  # calibrated, not bitwise
        print(f"SIZED {recipe} hsdp2x2 grads_bf16: sharding_invariance {q} rel-L2 "
              f"{rows['rel_l2']['value']:.3g} vs tolerance {rows['rel_l2']['tolerance']:.3g}")
    assert _fails(res, "sharding_invariance", "grads"), _rows(res, "sharding_invariance", "grads")
    assert _fails(res, "sharding_invariance", "params") is (recipe != "current")
