"""Bring your own model (harness/spec/models.py): module axis values that name a factory, the
tasks they train on, the built-in LlamaStack, and the load-time checks of a factory. No
process groups here; tests/test_model_controls.py launches real ones."""

import sys

import pytest
import torch
import yaml

from harness.distributed import data, modules, parallel
from harness.plugin import model_check
from harness.spec import catalog, models
from harness.spec.matrix import Case, expand
from harness.spec.scenario import ModelDims, ScenarioError, load_scenario

FACTORIES = '''
import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel


class Net(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1 = nn.Linear(d.hidden, d.ffn)
        self.fc2 = nn.Linear(d.ffn, d.hidden)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def build(ctx):
    with torch.device(ctx.device):
        return Net(ctx.dims)


def plan(model, ctx):
    return {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}


def plan_missing(model, ctx):
    return {"fc3": ColwiseParallel()}


def raises(ctx):
    raise RuntimeError("out of coffee")


def not_a_module(ctx):
    return 42


def no_params(ctx):
    return nn.ReLU()


def wrong_width(ctx):
    return nn.Linear(ctx.dims.hidden, ctx.dims.hidden + 1)


ENTRY = {"factory": build, "tp_plan": "byo_factories:plan"}
'''


@pytest.fixture
def factories(tmp_path, monkeypatch):
    (tmp_path / "byo_factories.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("byo_factories", None)


def scenario(tmp_path, models_=None, module=("mine",), mesh=("dp2",), **extra):
    doc = dict(name="s", description="t")
    if models_ is not None:
        doc["models"] = models_
    doc["axes"] = dict(recipe=["fp32"], mesh=list(mesh), module=list(module), dcp=["sync"],
                       reshard=["none"])
    doc.update(extra)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


MINE = {"mine": {"factory": "byo_factories:build", "tp_plan": "byo_factories:plan"}}


def test_a_named_factory_is_a_readable_module_axis_value(tmp_path, factories):
    spec = load_scenario(scenario(tmp_path, MINE, module=["mine", "LlamaStack"]))
    cases = expand(spec)
    assert [c.id for c in cases] == ["s[fp32-dp2-mine-sync-none]", "s[fp32-dp2-LlamaStack-sync-none]"]
    mine, llama = cases
    assert mine.model_ref == models.ModelRef("mine", "byo_factories:build", "byo_factories:plan")
    assert mine.model_ref.origin == "models.mine" and mine.task == "regression"
    assert llama.model_ref is None and llama.task == "next_token"
    assert Case.from_json(mine.to_json()) == mine


@pytest.mark.parametrize("entry, field, fragment", [
    ({"factory": "no-colon"}, "models.mine.factory", "import path 'package.module:name'"),
    ({"factory": "a:b", "tp_plan": 3}, "models.mine.tp_plan", "got 3"),
    ({"factory": "a:b", "task": "classify"}, "models.mine.task", "allowed: regression, projection"),
    ({"factory": "a:b", "layers": 2}, "models.mine.layers", "unknown field"),
])
def test_bad_models_entries_name_the_field(tmp_path, entry, field, fragment):
    p = scenario(tmp_path, {"mine": entry})
    with pytest.raises(ScenarioError, match=field) as e:
        load_scenario(p)
    assert str(e.value).startswith(str(p)) and fragment in str(e.value)


def test_a_models_name_cannot_shadow_a_built_in(tmp_path):
    with pytest.raises(ScenarioError, match="'LlamaStack' is a built-in module"):
        load_scenario(scenario(tmp_path, {"LlamaStack": {"factory": "a:b"}}))


def test_an_unknown_module_lists_what_is_allowed(tmp_path):
    with pytest.raises(ScenarioError, match=r"axes.module\[0\]: unknown module 'nope'.*LlamaStack"):
        load_scenario(scenario(tmp_path, None, module=["nope"]))


def test_a_tp_mesh_needs_a_tp_plan(tmp_path, factories):
    p = scenario(tmp_path, {"mine": {"factory": "byo_factories:build"}}, mesh=["dp2xtp2"])
    with pytest.raises(ScenarioError, match="model 'mine' .* has no tp_plan; a TP mesh needs one"):
        expand(load_scenario(p))


def test_layers_and_vocab_are_validated_dims(tmp_path):
    p = scenario(tmp_path, None, module=["LlamaStack"], mesh=["dp2xtp2"],
                 model={"vocab": 127, "layers": 3})
    with pytest.raises(ScenarioError, match="model.vocab=127 is not divisible by tp=2"):
        expand(load_scenario(p))
    p = scenario(tmp_path, None, module=["LlamaStack"], model={"layers": 0})
    with pytest.raises(ScenarioError, match="model.layers: must be >= 1 and <= 1024, got 0"):
        load_scenario(p)


def test_an_installed_entry_point_adds_a_name(tmp_path, factories, monkeypatch):
    dist = tmp_path / "byo_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: byo-pkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[{catalog.MODULE_ENTRY_POINTS}]\ninstalled = byo_factories:ENTRY\n")
    assert "installed" in models.installed()
    [case] = expand(load_scenario(scenario(tmp_path, None, module=["installed"])))
    assert case.model_ref.factory == "byo_factories:build"  # a function becomes its path
    assert case.model_ref.tp_plan == "byo_factories:plan"
    assert case.model_ref.origin == "entry point harness.modules:installed"
    # a scenario's own entry of the same name shadows the installed one
    own = {"installed": {"factory": "byo_factories:wrong_width"}}
    [case] = expand(load_scenario(scenario(tmp_path, own, module=["installed"])))
    assert case.model_ref.factory == "byo_factories:wrong_width"


def _case(tmp_path, factory, tp_plan=None, task="regression"):
    entry = {"factory": factory, "task": task, **({"tp_plan": tp_plan} if tp_plan else {})}
    [case] = expand(load_scenario(scenario(tmp_path, {"mine": entry})))
    return case


def test_probe_accepts_a_good_factory(tmp_path, factories):
    case = _case(tmp_path, "byo_factories:build", "byo_factories:plan")
    model_check.probe(case.model_ref, case, "torch", "cpu", needs_tp=True)


@pytest.mark.parametrize("factory, tp_plan, message", [
    ("byo_factories:raises", None,
     "factory byo_factories:raises raised RuntimeError: out of coffee"),
    ("byo_missing:build", None, "factory byo_missing:build cannot be imported: "
                                "ModuleNotFoundError: No module named 'byo_missing'"),
    ("byo_factories:absent", None, "factory byo_factories:absent cannot be imported: "
                                   "AttributeError:"),
    ("byo_factories:not_a_module", None, "returned int, not a torch.nn.Module"),
    ("byo_factories:no_params", None, "returned a ReLU without parameters"),
    ("byo_factories:wrong_width", None, "the model returns (8, 8, 33), the 'regression' task "
                                        "needs (8, 8, 32) ([batch, seq, hidden])"),
    ("byo_factories:build", "byo_factories:plan_missing",
     "tp_plan byo_factories:plan_missing: 'fc3' names no submodule of Net"),
])
def test_probe_names_what_is_wrong_with_the_factory(tmp_path, factories, factory, tp_plan,
                                                    message):
    case = _case(tmp_path, factory, tp_plan)
    with pytest.raises(models.ModelError) as e:
        model_check.probe(case.model_ref, case, "torch", "cpu", needs_tp=True)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_next_token_factory_must_return_logits(tmp_path, factories):
    case = _case(tmp_path, "byo_factories:build", task="next_token")
    with pytest.raises(models.ModelError, match="the model's forward raised .* on the "
                                                "'next_token' task's input int64 token ids"):
        model_check.probe(case.model_ref, case, "torch", "cpu", needs_tp=False)


def test_tasks_keep_the_regression_data_and_shift_tokens():
    d = ModelDims(hidden=16, out_features=6, vocab=50, batch=4, seq=5)
    g = torch.Generator().manual_seed(7 * 1_000_003 + 1)  # the historical float data
    x, y = data.TASKS["projection"].global_batch(d, 7, 1)
    assert torch.equal(x, torch.randn(4, 5, 16, generator=g))
    assert torch.equal(y, torch.randn(4, 5, 6, generator=g))
    ids, nxt = data.TASKS["next_token"].global_batch(d, 7, 1)
    assert ids.dtype == torch.int64 and ids.shape == (4, 5) and int(ids.max()) < 50
    assert torch.equal(ids[:, 1:], nxt[:, :-1])  # targets are the next tokens
    logits = torch.zeros(4, 5, 50)
    assert data.TASKS["next_token"].loss(logits, nxt).item() == pytest.approx(torch.log(
        torch.tensor(50.0)).item())
    for kind, task in catalog.MODULE_TASKS.items():
        assert task in data.TASKS, kind


def test_llama_stack_ties_its_head_to_the_embedding():
    d = ModelDims(hidden=32, ffn=64, heads=4, layers=3, vocab=40)
    m = modules.build("LlamaStack", d, seed=3)
    assert m.lm_head.weight is m.embed.weight and len(m.layers) == 3
    assert parallel.tied_groups(m) == [("embed.weight", "lm_head.weight")]
    ids, _ = data.TASKS["next_token"].global_batch(ModelDims(**{**d.__dict__, "batch": 2}), 1, 0)
    assert m(ids).shape == (2, d.seq, 40)
    again = modules.build("LlamaStack", d, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(),
                                                 again.state_dict().values()))


def test_retie_restores_a_tie_that_was_broken():
    m = modules.build("LlamaStack", ModelDims(), seed=1)
    ties = parallel.tied_groups(m)
    m.lm_head.weight = torch.nn.Parameter(m.embed.weight.detach().clone())
    assert parallel.tied_groups(m) == []
    parallel.retie(m, ties)
    assert m.lm_head.weight is m.embed.weight


def test_reference_llama_stack_maps_every_canonical_name():
    from harness.reference import build as ref
    d = ModelDims(hidden=32, ffn=64, heads=4, layers=2, vocab=40)
    m = ref.build_meta("LlamaStack", d, ref.Env("mxfp8", ref.TP()))
    canonical = modules.build("LlamaStack", d, seed=1).state_dict()
    names = m.canonical_names()
    assert sorted(names.values()) == sorted(canonical)
    assert m.lm_head.weight is m.embed.weight
    quantized = {n for n, p in m.named_parameters() if type(p.data) is not torch.Tensor}
    assert quantized and not any(n.startswith(("embed", "lm_head", "norm")) for n in quantized)


def test_the_example_model_passes_its_load_time_checks():
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    spec = load_scenario(root / "examples" / "my_model" / "my_model.yaml")
    sys.path.insert(0, str(root))
    try:
        for case in expand(spec):
            model_check.probe(case.model_ref, case, "torch", "cpu", needs_tp=case.mesh.tp > 1)
    finally:
        sys.path.remove(str(root))


def test_reshard_phase_checks_are_listed_in_the_catalog():
    from harness import checks
    assert {c.name for c in checks.core() if c.phase == "reshard"} == \
        set(catalog.RESHARD_PHASE_CHECKS)


def test_layout_knows_llama_stacks_quantized_weights():
    """Collection-time layout skips see LlamaStack's decoder projections (every layer alike)
    and never its high-precision embedding and head; a factory's model has no layout table."""
    from harness.backends import layout
    d = ModelDims(hidden=256, ffn=512, heads=4, layers=2, vocab=128)
    ref = {w.name: (w.rows, w.cols, w.tp) for w in layout.reference_weights("LlamaStack", d)}
    assert ref["layers.0.layernorm_mlp.fc1_weight"] == (512, 256, "column")
    assert ref["layers.0.self_attention.proj_weight"] == (256, 256, "row")
    te = {w.name for w in layout.te_weights("LlamaStack", d)}
    assert "layers.0.self_attention.layernorm_qkv.weight" in te
    assert not any(n.startswith(("embed", "lm_head")) for n in set(ref) | te)


BLOCKING = '''
import os
import time


def blocks(ctx):
    time.sleep(3600)


def exits(ctx):
    os._exit(3)
'''


@pytest.mark.parametrize("factory, message", [
    ("byo_blocking:blocks", "factory byo_blocking:blocks (with its tp_plan and one forward) "
                            "did not return within 3 s at collection; it was killed"),
    ("byo_blocking:exits", "factory byo_blocking:exits ended the process at collection "
                           "(exit status 3) instead of returning a model"),
])
def test_a_factory_that_blocks_or_exits_is_named(tmp_path, factories, factory, message):
    """Collection waits for a factory a bounded time, in a process it can kill (issue 61):
    before, a blocking factory hung the run and one calling os._exit(3) ended it silently."""
    import time
    (tmp_path / "byo_blocking.py").write_text(BLOCKING)
    case = _case(tmp_path, factory)
    t = time.monotonic()
    try:
        with pytest.raises(models.ModelError) as e:
            model_check.probe_bounded(case.model_ref, case, "torch", "cpu", needs_tp=False,
                                      timeout_s=3)
    finally:
        sys.modules.pop("byo_blocking", None)
    assert message in str(e.value) and time.monotonic() - t < 30


def test_bounded_probe_passes_a_good_factory_and_reports_a_bad_one(tmp_path, factories):
    case = _case(tmp_path, "byo_factories:build", "byo_factories:plan")
    model_check.probe_bounded(case.model_ref, case, "torch", "cpu", needs_tp=True)
    bad = _case(tmp_path, "byo_factories:raises")
    with pytest.raises(models.ModelError, match="raised RuntimeError: out of coffee"):
        model_check.probe_bounded(bad.model_ref, bad, "torch", "cpu", needs_tp=False)


def test_a_cuda_probe_starts_a_fresh_interpreter():
    """A child forked after the parent counted the GPUs cannot use CUDA ("Cannot re-initialize
    CUDA in forked subprocess": the example my_model on a GPU was a usage error at collection);
    a CUDA probe spawns, a CPU probe forks while this process holds no CUDA context."""
    assert model_check._context("cuda").get_start_method() == "spawn"
    assert model_check._context("cuda:0").get_start_method() == "spawn"
    assert model_check._context("cpu").get_start_method() == "fork"


PARALLEL = '''
import torch
from byo_factories import build as plain


def build(ctx):
    (torch.randn(4_000_000) * 2).sum()  # an OpenMP parallel region, where threads allow one
    return plain(ctx)
'''


def test_a_good_factory_passes_after_this_process_used_openmp_threads(tmp_path, factories):
    """The probe's forked child computes on one thread: after its parent ran an OpenMP parallel
    region, a child's own parallel region waited for good for the team that did not fork with
    it, and a good factory was named 'did not return within 120 s' (seen in CI, an xdist worker
    whose earlier tests computed in-process)."""
    (tmp_path / "byo_parallel.py").write_text(PARALLEL)
    case = _case(tmp_path, "byo_parallel:build")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        (torch.randn(4_000_000) * 2).sum()  # this process's OpenMP team: two threads
        model_check.probe_bounded(case.model_ref, case, "torch", "cpu", needs_tp=False,
                                  timeout_s=30)
    finally:
        torch.set_num_threads(threads)
        sys.modules.pop("byo_parallel", None)
