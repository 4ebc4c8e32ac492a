"""Negative controls for models a scenario brings (harness/spec/models.py) and the tied_weights
check: a tie lost on load fails the check naming the tied parameters; a factory that raises or
cannot be imported is a one-line usage error at load time naming the scenario file and the
factory (no launch)."""

from pathlib import Path

import pytest
from forked import rank_server
from subprocs import run_pytest

from harness.launch.launcher import Launcher
from harness.launch.scheduler import Scheduler
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario

TEST_SCENARIOS = Path(__file__).resolve().parent / "scenarios"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    cases = expand(load_scenario(TEST_SCENARIOS / "negative_controls_models.yaml"), "torch")
    root = tmp_path_factory.mktemp("tied")
    with rank_server("torch") as server, \
            Scheduler(Launcher(root / "launches", "torch", "cpu", rank_server=server), cases,
                      root / "ckpt") as sched:
        return {c.ax["fault"]: sched.result(c) for c in cases}


def _rows(res, phase, quantity, metric="violations"):
    return [r for r in res.rows if (r["phase"], r["check"], r["quantity"], r["metric"])
            == (phase, "tied_weights", quantity, metric)]


def test_a_tie_lost_on_load_fails_tied_weights_naming_the_parameters(tied):
    res = tied["untie_on_load"]
    assert res.status == "ok", res.errors
    [trained] = _rows(res, "train", "trained.same_tensor")
    assert trained["outcome"] == "pass"  # training kept the tie; the load lost it
    for phase, run in (("train", "loaded"), ("reshard", "resharded")):
        [same] = _rows(res, phase, f"{run}.same_tensor")
        assert same["outcome"] == "fail"
        assert "embed.weight = lm_head.weight: 2 distinct tensors, 2 storages " \
               "(lm_head.weight no longer embed.weight)" in same["detail"]
        [optim] = _rows(res, phase, f"{run}.optimizer")
        assert optim["outcome"] == "fail"
        assert "the optimizer holds 1 of them (not lm_head.weight)" in optim["detail"]
    cov = {(r["phase"], r["check"]): r["outcome"] for r in res.rows if r["metric"] == "coverage"}
    assert cov[("train", "tied_weights")] == cov[("reshard", "tied_weights")] == "failed"


def test_the_tie_holds_in_the_clean_case(tied):
    res = tied["none"]
    assert res.passed, (res.errors, res.failed_rows)
    quantities = {(r["phase"], r["quantity"]) for r in res.rows if r["check"] == "tied_weights"}
    assert quantities >= {("train", "has_tied_weights"), ("train", "trained.same_tensor"),
                          ("train", "loaded.values"), ("train", "loaded.optimizer"),
                          ("reshard", "resharded.same_tensor"), ("reshard", "resharded.values"),
                          ("reshard", "resharded.optimizer")}
    [has] = [r for r in res.rows if r["quantity"] == "has_tied_weights" and r["phase"] == "train"]
    assert has["detail"] == "embed.weight = lm_head.weight"


BAD_FACTORIES = '''
def raises(ctx):
    raise ValueError("vocab must be a power of two")
'''

SCENARIO = """\
name: byo
description: a model from a factory
models:
  mine: {{factory: "{factory}"}}
axes:
  recipe: [fp32]
  mesh: [dp2]
  module: [mine]
  dcp: [sync]
  reshard: [none]
"""


@pytest.mark.parametrize("factory, what", [
    ("byo_bad:raises", "factory byo_bad:raises raised ValueError: vocab must be a power of two"),
    ("byo_nowhere.model:build", "factory byo_nowhere.model:build cannot be imported: "
                                "ModuleNotFoundError: No module named 'byo_nowhere'"),
])
def test_a_bad_factory_is_a_one_line_usage_error_at_load_time(tmp_path, factory, what):
    (tmp_path / "byo_bad.py").write_text(BAD_FACTORIES)
    path = tmp_path / "byo.yaml"
    path.write_text(SCENARIO.format(factory=factory))
    rc, out = run_pytest(tmp_path, "--scenario", str(path), "--report-dir",
                         str(tmp_path / "reports"), timeout=300)
    assert rc == 4, out  # pytest's usage error: nothing was collected or launched
    [line] = [ln for ln in out.splitlines() if ln.startswith("ERROR:")]
    assert line == f"ERROR: {path}: models.mine: {what}", out
    assert not (tmp_path / "reports" / "runs").exists()
