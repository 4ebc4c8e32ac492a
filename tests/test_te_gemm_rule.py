"""TE's quantized GEMMs need every dim a multiple of 16 (cuBLASLt: "ret.lda % 16 == 0. Leading
dimension requirement on A for FP8 GEMM. Caller must pad."). Found by a QA probe on real TE
(one H200 pair, 2026-11-29): a user's batch 12 x seq 12 on dp2 (72 tokens a rank), dp6 /
hsdp2x3 / hsdp3x2 (24) and reshards onto dp2 raised it in train, the one-rank twin or the
reshard phase -- 20 of 40 cases failed as errors instead of saying what TE cannot run. Now a
skip at collection (harness/backends/layout.py gemm_problem)."""

import glob
from pathlib import Path

from harness.backends import layout
from harness.backends.te_backend import TEBackend
from harness.spec.matrix import expand
from harness.spec.mesh import parse_mesh
from harness.spec.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent

PROBE = """\
name: user_odd
description: a user's batch 12 x seq 12 at world sizes 2, 3 and 6
axes:
  recipe: {te: [bf16, delayed, current]}
  mesh: [dp2, dp3, dp6, hsdp3x2, dp3xtp2]
  module: [LayerNormMLP]
  dcp: [sync]
  reshard: [none, to_dp2]
model: {hidden: 384, ffn: 768, heads: 6, seq: 12, batch: 12, out_features: 384}
timeout_s: 60
"""


def _why(tmp_path, text=PROBE):
    (tmp_path / "user_odd.yaml").write_text(text)
    return {(c.recipe, c.ax["mesh"], c.ax["reshard"]): TEBackend.layout_skip_reason(c)
            for c in expand(load_scenario(tmp_path / "user_odd.yaml"), "te")}


def test_tokens_per_rank_not_a_multiple_of_16_skip_naming_batch_ranks_and_seq(tmp_path):
    why = _why(tmp_path)
    assert why[("current", "dp6", "none")] == (
        "current GEMMs need dims that are multiples of 16 (TE's cuBLASLt call asserts 'Leading "
        "dimension requirement ... Caller must pad'): on mesh dp6, 24 tokens per rank (batch 12 "
        "/ 6 data-parallel ranks x seq 12)")
    assert "on mesh dp2, 72 tokens per rank" in why[("delayed", "dp2", "none")]
    assert "on mesh hsdp3x2, 24 tokens" in why[("delayed", "hsdp3x2", "none")]
    # dp3 (48 tokens) runs on its own mesh; resharded onto dp2 it would multiply 72
    assert why[("current", "dp3", "none")] is None
    assert "on reshard target dp2, 72 tokens" in why[("current", "dp3", "to_dp2")]
    assert why[("current", "dp3xtp2", "none")] is None  # TP ranks share their slice
    assert all(r is None for (recipe, _, _), r in why.items() if recipe == "bf16")  # no FP8 GEMM


def test_tp_local_weight_dims_are_checked_too():
    case = next(c for c in expand(load_scenario(ROOT / "tests" / "scenarios" /
                                                "te_unseen_config.yaml"), "te"))
    w = [layout.Weight("fc1_weight", 200, 512, "column")]
    assert layout.gemm_problem(case, parse_mesh("dp2"), w, 16) == \
        "weight fc1_weight [200 x 512] per TP rank"  # 200 = 12.5 x 16
    assert layout.gemm_problem(case, parse_mesh("dp2xtp2"), w, 16) == \
        "weight fc1_weight [100 x 512] per TP rank"
    assert layout.gemm_problem(case, parse_mesh("dp2"), [layout.Weight("w", 512, 512, "row")],
                               16) is None


def test_no_shipped_scenario_meets_the_rule():
    """The shipped scenarios already size TE's dims for it (fsdp2_tp_dcp's dp8 batch 16)."""
    met, n = [], 0
    for f in sorted(glob.glob(str(ROOT / "scenarios" / "*.yaml"))
                    + glob.glob(str(ROOT / "tests" / "scenarios" / "*.yaml"))):
        try:
            cases = expand(load_scenario(f), "te")
        except Exception:  # noqa: BLE001 - not a scenario (xfails.yaml) or none for te
            continue
        n += len(cases)
        met += [c.id for c in cases
                if "GEMMs need dims" in (TEBackend.layout_skip_reason(c) or "")]
    assert n > 2000 and met == []  # 2,141 TE cases today
