"""Real TE with a user's factory model on FSDP2 x TP (tests/scenarios/te_factory_model.yaml):
the factory's TP plan goes through ``parallel.apply_tp`` before FSDP2 shards, DCP saves and
loads it, a reshard leaves TP, the tied head stays tied. Clean cases pass and a 1.5x learning
rate fails fp32_parity, each judged by populations measured on demand for this configuration.
Skips without CUDA and TE."""

from pathlib import Path

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "te_factory_model.yaml"


def test_a_factory_model_runs_fsdp2_x_tp_on_te(require_te, run_scenario_file):
    require_te(SCENARIO)
    out, history = run_scenario_file(SCENARIO, timeout_s=900)
    assert history is not None, out[-3000:]
    outcome = history.groupby("case_id")["case_outcome"].first().to_dict()
    assert len(outcome) == 4, out[-3000:]
    for cid, got in outcome.items():
        assert got == ("failed" if "lr_scale_1.5" in cid else "passed"), (cid, out[-3000:])
    rows = history[history["metric"].isin(["max_abs", "rel_l2"])]
    assert not (rows["row_outcome"] == "unjudged").any() and "tol nan" not in out
    bad = rows[rows["row_outcome"] == "fail"]
    assert set(bad["case_id"]) == {c for c in outcome if "lr_scale_1.5" in c}
    assert "fp32_parity" in set(bad["check"])
    tp = history[history["case_id"].str.contains("dp2xtp2") & (history["check"] == "tied_weights")]
    assert (tp["row_outcome"] == "pass").sum() > 0  # the head stayed tied under TP
