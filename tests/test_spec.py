"""Scenario validation: every bad input gives a message naming the file, the field and what is
allowed."""


import pytest
import yaml

from harness.spec.matrix import expand
from harness.spec.scenario import ScenarioError, load_scenario, scenario_paths

BASE = dict(
    name="t",
    axes=dict(recipe=["fp32", "bf16"], mesh=["dp2", "dp2xtp2"], module=["LayerNormMLP"],
              dcp=["sync"], reshard=["none", "to_dp4"]),
)


def write(tmp_path, doc, name="t"):
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def bad(tmp_path, doc, *fragments, name="t"):
    p = write(tmp_path, doc, name)
    with pytest.raises(ScenarioError) as e:
        expand(load_scenario(p), "torch")
    msg = str(e.value)
    assert msg.startswith(str(p)), msg
    for f in fragments:
        assert f in msg, msg
    return msg


def with_axis(**kw):
    d = {**BASE, "axes": {**BASE["axes"], **kw}}
    return d


def test_valid(tmp_path):
    spec = load_scenario(write(tmp_path, BASE))
    assert spec.name == "t" and list(spec.axes) == ["recipe", "mesh", "module", "dcp", "reshard"]
    assert len(expand(spec)) == 8


def test_unknown_recipe(tmp_path):
    bad(tmp_path, with_axis(recipe=["fp32", "fp9"]), "axes.recipe[1]", "unknown recipe 'fp9'",
        "allowed: fp32, bf16")


def test_recipe_not_available_for_backend(tmp_path):
    bad(tmp_path, with_axis(recipe=["delayed"]), "axes.recipe[0]", "not available with "
        "--backend torch", "allowed: fp32, bf16")


def test_recipe_per_backend_mapping(tmp_path):
    spec = load_scenario(write(tmp_path, with_axis(recipe={"torch": ["fp32"], "reference": ["nvfp4"]})))
    assert {c.recipe for c in expand(spec, "torch")} == {"fp32"}
    assert {c.recipe for c in expand(spec, "reference")} == {"nvfp4"}
    with pytest.raises(ScenarioError, match="no values for backend 'te'"):
        expand(spec, "te")


def test_bad_mesh_string(tmp_path):
    bad(tmp_path, with_axis(mesh=["dp2", "dpx2"]), "axes.mesh[1]", "bad mesh 'dpx2'", "hsdp<R>x<S>")


def test_bad_reshard(tmp_path):
    bad(tmp_path, with_axis(reshard=["dp4"]), "axes.reshard[0]", "'none' or 'to_<mesh>'")
    bad(tmp_path, with_axis(reshard=["to_tp3"]), "axes.reshard[0]", "bad reshard target")


def test_world_size_not_divisible(tmp_path):
    # global batch 8 cannot be split over 3 data-parallel ranks
    bad(tmp_path, with_axis(mesh=["dp3"]), "axes.mesh 'dp3'", "model.batch=8", "3 data-parallel")
    # out_features 30 (a Linear's output rows) is not divisible by tp 4
    bad(tmp_path, with_axis(mesh=["dp1xtp4"], module=["Linear"]), "model.out_features=30", "tp=4")
    bad(tmp_path, {**with_axis(reshard=["to_dp16"])}, "axes.reshard 'to_dp16'", "16 data-parallel")


def test_unknown_check(tmp_path):
    bad(tmp_path, {**BASE, "checks": ["fp32_parity", "vibes"]}, "checks[1]", "unknown check 'vibes'",
        "dcp_roundtrip")


def test_unknown_module_and_dcp(tmp_path):
    bad(tmp_path, with_axis(module=["Conv2d"]), "axes.module[0]", "unknown module", "TransformerLayer")
    bad(tmp_path, with_axis(dcp=["async"]), "axes.dcp[0]", "unknown dcp mode", "async_process")


def test_unknown_top_level_field(tmp_path):
    bad(tmp_path, {**BASE, "stepz": 3}, "stepz", "unknown field")


def test_name_must_match_file(tmp_path):
    bad(tmp_path, BASE, "name", "must match the file name 'other'", name="other")


def test_missing_axis(tmp_path):
    axes = dict(BASE["axes"])
    del axes["dcp"]
    bad(tmp_path, {**BASE, "axes": axes}, "missing axes ['dcp']")


def test_duplicate_and_empty_values(tmp_path):
    bad(tmp_path, with_axis(mesh=["dp2", "dp2"]), "axes.mesh", "duplicate")
    bad(tmp_path, with_axis(mesh=[]), "axes.mesh", "non-empty list")


def test_exclude_validation(tmp_path):
    bad(tmp_path, {**BASE, "exclude": [{"meshh": "dp2"}]}, "exclude[0].meshh", "unknown axis")
    bad(tmp_path, {**BASE, "exclude": [{"mesh": "dp8*"}]}, "exclude[0].mesh", "matches none")


def test_exclude_everything(tmp_path):
    bad(tmp_path, {**BASE, "exclude": [{"recipe": "*"}]}, "leave no case")


def test_model_and_train_fields(tmp_path):
    bad(tmp_path, {**BASE, "model": {"hidden": -4}}, "model.hidden", ">= 1")
    bad(tmp_path, {**BASE, "model": {"hiden": 4}}, "model.hiden", "unknown field")
    bad(tmp_path, {**BASE, "train": {"steps": 2.5}}, "train.steps", "integer")
    bad(tmp_path, {**BASE, "timeout_s": 0}, "timeout_s", "> 0")


def test_tolerance_override_needs_reason(tmp_path):
    tol = {"fp32_parity": {"bf16": {"max_abs": 0.1, "rel_l2": 0.1}}}
    bad(tmp_path, {**BASE, "tolerances": tol}, "tolerances.fp32_parity.bf16", "reason")
    tol = {"fp32_parity": {"bf16": {"max_abs": 0.1, "rel_l2": 0.1, "reason": "x", "atol": 1}}}
    bad(tmp_path, {**BASE, "tolerances": tol}, "tolerances.fp32_parity.bf16.atol", "unknown field")


def test_not_yaml(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("axes: [unclosed")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(p)


def test_scenario_paths_skip_registry(tmp_path):
    write(tmp_path, BASE)
    (tmp_path / "xfails.yaml").write_text("entries: []\n")
    assert list(scenario_paths(tmp_path)) == ["t"]


def test_shipped_scenarios_are_valid():
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    for name, path in scenario_paths(root / "scenarios").items():
        spec = load_scenario(path)
        assert spec.description, f"{name} needs a description"
        recipes = spec.axes["recipe"]
        backends = list(recipes) if isinstance(recipes, dict) else ["torch"]
        for backend in backends:
            assert expand(spec, backend)


def test_a_tp_mesh_must_divide_only_the_dims_the_module_builds_with(tmp_path):
    """A user's dp1xtp3 (the QA probe of 2026-11-29) had been refused for vocab=128, which no
    TransformerLayer uses, and LayerNormMLP for out_features=30; the dims they build with are
    still checked."""
    model = {"hidden": 48, "ffn": 96, "heads": 6, "batch": 12}
    for module in ("TransformerLayer", "LayerNormMLP", "MultiheadAttention"):
        ok = write(tmp_path, {**with_axis(mesh=["dp1xtp3"], module=[module]), "model": model})
        assert len(expand(load_scenario(ok), "torch")) == 4  # 2 recipes x 2 reshards
    bad(tmp_path, {**with_axis(mesh=["dp1xtp3"], module=["Linear"]),
                   "model": {**model, "out_features": 32}}, "model.out_features=32", "tp=3")
    bad(tmp_path, {**with_axis(mesh=["dp1xtp3"], module=["TransformerLayer"]),
                   "model": {**model, "ffn": 100}}, "model.ffn=100", "tp=3")
    bad(tmp_path, {**with_axis(mesh=["dp1xtp3"], module=["MultiheadAttention"]),
                   "model": {**model, "heads": 5}}, "model.hidden=48", "model.heads=5")
