"""Real TE at a configuration no calibration ran (tests/scenarios/te_unseen_config.yaml: hidden
512, seq 16, batch 16, 5 steps at lr 5e-3, seed 77; bf16 / delayed / current / block on dp2, dp4,
dp2xtp2): populations measured on demand judge it. Every clean case passes; a 1.5x learning
rate fails everywhere; gradients reduced in bf16 fail sharding_invariance on every recipe and
mesh (block formats: a twin without FSDP; TP: a twin that keeps the TP split). Skips without
CUDA and TE."""

from pathlib import Path

from harness.calibration import twin
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "te_unseen_config.yaml"


def test_an_unseen_configuration_is_judged_by_its_own_populations(require_te, run_scenario_file):
    require_te(SCENARIO)
    cases = expand(load_scenario(SCENARIO), "te")
    out, history = run_scenario_file(SCENARIO, timeout_s=1500)
    assert history is not None, out[-3000:]
    outcome = history.groupby("case_id")["case_outcome"].first().to_dict()
    ran = {c.id: c for c in cases if outcome.get(c.id) not in (None, "skipped")}
    assert ran, out[-3000:]
    rows = history[history["metric"].isin(["max_abs", "rel_l2"])]
    assert not (rows["row_outcome"] == "unjudged").any() and "tol nan" not in out
    for cid, c in ran.items():
        fault = c.ax["fault"]
        if fault == "none" or fault == "lr_scale_1.5":
            assert outcome[cid] == ("passed" if fault == "none" else "failed"), cid
        elif twin.not_applicable(c, "te", "cuda") is None:
            bad = rows[(rows["case_id"] == cid) & (rows["row_outcome"] == "fail")]
            assert "sharding_invariance" in set(bad["check"]), cid
    bugs = [c for c in ran.values() if c.ax["fault"] == "grads_bf16_before_reduce"]
    assert all(twin.not_applicable(c, "te", "cuda") is None for c in bugs)  # a twin everywhere
    assert {c.recipe for c in bugs} >= {"bf16", "current", "delayed", "block"}
    assert {c.mesh.name for c in bugs} >= {"dp2", "dp4", "dp2xtp2"}
