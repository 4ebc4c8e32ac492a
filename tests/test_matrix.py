import yaml

from harness.spec.matrix import Case, expand
from harness.spec.scenario import load_scenario

DOC = dict(
    name="m",
    axes=dict(recipe=["fp32", "bf16"], mesh=["dp2", "dp2xtp2"], module=["LayerNormMLP", "Linear"],
              dcp=["sync", "async_thread"], reshard=["none", "to_dp4"]),
)


def spec(tmp_path, **extra):
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump({**DOC, **extra}, sort_keys=False))
    return load_scenario(p)


def test_ids_are_readable_and_in_axis_order(tmp_path):
    cases = expand(spec(tmp_path))
    assert len(cases) == 32
    assert cases[0].id == "m[fp32-dp2-LayerNormMLP-sync-none]"
    assert cases[-1].id == "m[bf16-dp2xtp2-Linear-async_thread-to_dp4]"
    assert len({c.id for c in cases}) == 32


def test_expansion_is_deterministic(tmp_path):
    s = spec(tmp_path)
    assert [c.id for c in expand(s)] == [c.id for c in expand(s)]


def test_exclude_globs_and_lists(tmp_path):
    cases = expand(spec(tmp_path, exclude=[{"mesh": "dp2x*", "reshard": "to_*"},
                                            {"recipe": ["bf16"], "module": "Linear"}]))
    assert not any(c.ax["mesh"] == "dp2xtp2" and c.ax["reshard"] != "none" for c in cases)
    assert not any(c.recipe == "bf16" and c.ax["module"] == "Linear" for c in cases)
    assert len(cases) == 32 - 8 - 8 + 2  # the two rules overlap on 2 cases


def test_cases_select_combinations(tmp_path):
    cases = expand(spec(tmp_path, cases=[
        {"recipe": "fp32", "mesh": "dp2", "module": "Linear", "dcp": "sync", "reshard": "to_dp4"},
        {"recipe": "bf16", "mesh": "dp2xtp2", "module": "LayerNormMLP"},  # other axes: all values
    ]))
    assert [c.label for c in cases] == [
        "fp32-dp2-Linear-sync-to_dp4",
        "bf16-dp2xtp2-LayerNormMLP-sync-none", "bf16-dp2xtp2-LayerNormMLP-sync-to_dp4",
        "bf16-dp2xtp2-LayerNormMLP-async_thread-none", "bf16-dp2xtp2-LayerNormMLP-async_thread-to_dp4"]


def test_checks_apply_per_case(tmp_path):
    by_label = {c.label: c for c in expand(spec(tmp_path))}
    assert by_label["fp32-dp2-Linear-sync-none"].checks == (
        "fp32_parity", "sharding_invariance", "dcp_roundtrip")
    assert by_label["fp32-dp2-Linear-async_thread-to_dp4"].checks == (
        "fp32_parity", "sharding_invariance", "dcp_roundtrip", "async_equivalence", "reshard")


def test_tied_weights_applies_where_a_module_may_tie(tmp_path):
    """The built-in modules but LlamaStack tie nothing: tied_weights in a scenario that mixes
    them runs for LlamaStack (and a scenario's own model), not as a failure of the others."""
    doc = dict(DOC, axes=dict(DOC["axes"], module=["Linear", "LlamaStack"], mesh=["dp2"]))
    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump(dict(doc, name="t", checks=["fp32_parity", "tied_weights"]),
                                sort_keys=False))
    checks = {c.ax["module"]: c.checks for c in expand(load_scenario(p))}
    assert checks == {"Linear": ("fp32_parity",), "LlamaStack": ("fp32_parity", "tied_weights")}


def test_world_sizes_and_target(tmp_path):
    c = next(c for c in expand(spec(tmp_path)) if c.label == "fp32-dp2xtp2-Linear-sync-to_dp4")
    assert c.world_sizes == (4, 4)
    assert c.target.name == "dp4" and c.mesh.tp == 2


def test_extra_axes_follow_core_axes(tmp_path):
    axes = {**DOC["axes"], "fault": ["none", "hang"]}
    cases = expand(spec(tmp_path, axes=axes))
    assert cases[1].id == "m[fp32-dp2-LayerNormMLP-sync-none-hang]"


def test_case_json_roundtrip(tmp_path):
    c = expand(spec(tmp_path))[5]
    back = Case.from_json(c.to_json())
    assert back == c and back.id == c.id and back.key == c.key and back.model == c.model


def test_marks_select_a_slice(tmp_path):
    cases = expand(spec(tmp_path, marks={"ci": [{"mesh": "dp2xtp2", "dcp": "async_thread"}]}))
    ci = [c for c in cases if "ci" in c.marks]
    assert len(ci) == 8 and all(c.ax["mesh"] == "dp2xtp2" and c.ax["dcp"] == "async_thread" for c in ci)


def test_model_overrides_first_match_wins(tmp_path):
    s = spec(tmp_path, model={"hidden": 64, "ffn": 128},
             model_overrides=[{"match": {"recipe": "bf16"}, "model": {"ffn": 256}}])
    dims = {c.recipe: c.model for c in expand(s)}
    assert (dims["fp32"].hidden, dims["fp32"].ffn) == (64, 128)
    assert (dims["bf16"].hidden, dims["bf16"].ffn) == (64, 256)  # unnamed dims from `model`
