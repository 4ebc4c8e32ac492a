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
