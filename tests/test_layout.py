"""Blocked formats vs shard boundaries, decided at collection (backends/layout.py): the rule
agrees with where the reference codecs really raise QuantizedLayoutError, and a scenario whose
dims cut blocks is skipped before any launch with weight, mesh, rows and block size named."""

from pathlib import Path

import pytest
import torch
from subprocs import run_pytest

from harness import backends
from harness.backends import layout
from harness.backends.te_backend import TEBackend
from harness.reference.codecs import QuantizedLayoutError
from harness.reference.quantizers import WeightQuantizer
from harness.spec.matrix import expand
from harness.spec.mesh import parse_mesh
from harness.spec.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent

MXFP8_96 = """\
name: mx96
description: MXFP8 with hidden 96 on dp2 -- 48-row shards cut 32-row blocks
axes:
  recipe: {reference: [mxfp8, current]}
  mesh: [dp2]
  module: [LayerNormMLP]
  dcp: [sync]
  reshard: [none]
model: {hidden: 96, ffn: 128, heads: 4, seq: 8, batch: 8, out_features: 96}
timeout_s: 60
"""


@pytest.mark.parametrize("recipe", ["block", "mxfp8", "nvfp4"])
def test_rule_matches_where_the_reference_codec_raises(recipe):
    """FSDP2 chunks a weight's rows (torch.chunk -> split -> slice of every quantized part):
    the rule predicts exactly the shapes whose chunking raises."""
    blocks = layout.reference_blocks(recipe)
    checked = 0
    for rows in (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512):
        q = WeightQuantizer(recipe).quantize(torch.randn(rows, 64))
        for shards in (2, 3, 4, 8):
            predicted = layout.cut_problem(layout.Weight("w", rows, 64, "replicate"),
                                           parse_mesh(f"dp{shards}"), blocks)
            try:
                torch.chunk(q, shards, dim=0)
                raised = None
            except QuantizedLayoutError as e:
                raised = e
            assert (predicted is None) == (raised is None), (rows, shards, predicted, raised)
            checked += 1
    assert checked == 44


def test_mxfp8_hidden_96_on_dp2_is_a_skip_naming_weight_mesh_rows_block(tmp_path):
    (tmp_path / "mx96.yaml").write_text(MXFP8_96)
    cases = {c.recipe: c for c in expand(load_scenario(tmp_path / "mx96.yaml"), "reference")}
    why = backends.get("reference").skip_reason(cases["mxfp8"], "cpu")
    assert why.startswith("mxfp8 (32 x 32 weight blocks): weight fc2_weight [96 x 128] on mesh "
                          "dp2: 48 rows per FSDP2 shard cut its 32-row blocks"), why
    assert backends.get("reference").skip_reason(cases["current"], "cpu") is None  # per-tensor
    assert TEBackend.layout_skip_reason(cases["mxfp8"]).startswith("MXFP8BlockScaling")


def test_reshard_target_and_tp_cuts_are_checked():
    w = layout.Weight("fc1_weight", 256, 96, "column")
    b = layout.reference_blocks("block")
    assert layout.cut_problem(w, parse_mesh("dp2"), b) is None
    assert "64 rows per FSDP2 shard" in layout.cut_problem(w, parse_mesh("dp4"), b)
    assert "64 rows per TP shard" in layout.cut_problem(w, parse_mesh("dp1xtp4"), b)
    row = layout.Weight("fc2_weight", 96, 256, "row")
    assert "64 columns per TP shard" in layout.cut_problem(row, parse_mesh("dp1xtp4"), b)


def test_shipped_reference_matrix_skips_exactly_the_block_layout_cases():
    """The 23 FP8-block-scaling cases of fsdp2_tp_dcp whose shards cut 128-row blocks (the
    registry's QuantizedLayoutError entries) -- and nothing else."""
    cases = expand(load_scenario(ROOT / "scenarios" / "fsdp2_tp_dcp.yaml"), "reference")
    be = backends.get("reference")
    skipped = [c for c in cases if be.skip_reason(c, "cpu")]
    assert len(skipped) == 23 and {c.recipe for c in skipped} == {"block"}
    assert all(c.ax["mesh"] == "dp4" or c.ax["reshard"] == "to_dp4"
               or c.ax["module"] == "TransformerLayer" for c in skipped)


def test_skip_happens_at_collection_without_a_launch(tmp_path):
    d = tmp_path / "scen"
    d.mkdir()
    (d / "mx96.yaml").write_text(MXFP8_96)
    rc, out = run_pytest(tmp_path, "--scenario", "mx96", "--scenario-dir", str(d), "-k", "mxfp8",
                         "-rs", "--report-dir", str(tmp_path / "reports"), timeout=300)
    assert rc == 0, out
    assert "1 skipped" in out and "48 rows per FSDP2 shard cut its 32-row blocks" in out
    assert "the axes name only backend 'reference'" in out  # no --backend needed
    # no case ran in a launch: none was started for a case the backend skips
    assert not list((tmp_path / "reports").glob("runs/*/launches/L*"))


UNEVEN = """\
name: uneven
description: a user's Linear with 30 output rows on 4 FSDP2 shards (8, 8, 8, 6)
axes:
  recipe: {reference: [fp32, current, delayed]}
  mesh: [dp4, dp2]
  module: [Linear]
  dcp: [sync]
  reshard: [none, to_dp3]
  fixes: {reference: [all, no_quantized_allgather]}
model: {hidden: 48, ffn: 96, heads: 4, seq: 8, batch: 24, out_features: 30}
timeout_s: 60
"""


def test_uneven_rule_is_where_fsdp2_pads_a_shard():
    """FSDP2 chunks dim 0 with torch.chunk, empty chunks where too few (_chunk_with_empty), and
    pads every shard to the first one's rows: the rule names exactly the shapes it pads."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty
    checked = 0
    for rows in (1, 3, 6, 8, 16, 30, 48, 96, 100, 255, 256):
        for shards in (2, 3, 4, 5, 6, 8):
            chunks = _chunk_with_empty(torch.empty(rows, 4), shards, dim=0)
            padded = any(c.size(0) != chunks[0].size(0) for c in chunks)
            w = layout.Weight("w", rows, 4, "replicate")
            assert (layout.uneven_problem(w, parse_mesh(f"dp{shards}")) is not None) == padded
            checked += 1
    assert checked == 66
    col = layout.Weight("qkv", 3 * 36, 36, "column")  # TP first: 54 rows each, then 4 shards
    assert layout.uneven_problem(col, parse_mesh("dp4xtp2")) == "54 rows over 4 FSDP2 shards"
    assert layout.uneven_problem(col, parse_mesh("hsdp2x3")) is None  # 108 over 3 shards
    assert layout.uneven_problem(layout.Weight("proj", 36, 108, "row"),  # TP cuts columns
                                 parse_mesh("dp4xtp2")) is None


def test_uneven_shards_of_quantized_all_gathers_skip_at_collection(tmp_path):
    """The QA probe's 30-row Linear on dp4 under current / delayed scaling: ranks 0-2 waited 60 s
    in the all-gather for rank 3, whose FSDP2 asserted on its unpadded shard. A skip naming
    weight, mesh and rows; fp32 and the high-precision all-gather (the fix off) still run."""
    (tmp_path / "uneven.yaml").write_text(UNEVEN)
    be = backends.get("reference")
    cases = expand(load_scenario(tmp_path / "uneven.yaml"), "reference")
    why = {(c.recipe, c.ax["mesh"], c.ax["reshard"], c.ax["fixes"]): be.skip_reason(c, "cpu")
           for c in cases}
    assert why[("current", "dp4", "none", "all")] == (
        "current all-gathered quantized: weight weight [30 x 48] on mesh dp4: 30 rows over 4 "
        "FSDP2 shards are uneven; TE's fsdp_pre_all_gather returns the unpadded shard, so FSDP2 "
        "asserts on the padded ranks and the others wait out the collective timeout (model "
        "dims that are multiples of the shards)")
    assert "on reshard target dp3: 30 rows over 3" not in (why[("delayed", "dp2", "to_dp3",
                                                                "all")] or "")  # 30 = 3 x 10
    assert why[("delayed", "dp4", "to_dp3", "all")].startswith("delayed all-gathered quantized")
    assert why[("delayed", "dp2", "none", "all")] is None  # 15 rows a shard: even
    assert all(r is None for (recipe, _, _, fixes), r in why.items()
               if recipe == "fp32" or fixes == "no_quantized_allgather")
    assert sum(r is not None for r in why.values()) == 4  # current / delayed x dp4 x 2 reshards
    te_case = next(c for c in cases if c.recipe == "current" and c.ax["mesh"] == "dp4")
    assert "30 rows over 4 FSDP2 shards" in TEBackend.layout_skip_reason(te_case)
