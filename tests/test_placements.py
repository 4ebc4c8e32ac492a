"""Placements the worker's parallelization produces, checked in one process with the fake
process group (no launch): FSDP2 x TP must give _StridedShard, HSDP (Replicate, Shard(0))."""

import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from harness.distributed import modules, parallel
from harness.spec.mesh import parse_mesh
from harness.spec.scenario import ModelDims


def placements(mesh_name, module="LayerNormMLP", recipe="fp32"):
    spec = parse_mesh(mesh_name)
    mesh = parallel.device_mesh(spec, "cpu")
    model = modules.build(module, ModelDims(), seed=0)
    parallel.parallelize(model, mesh, spec, recipe)
    return {n: (tuple(p.placements), tuple(p.device_mesh.mesh_dim_names))
            for n, p in model.named_parameters()}


def test_fsdp_tp_gives_strided_shard(fake_world):
    fake_world(4)
    pl = placements("dp2xtp2")
    assert pl["fc1.weight"] == ((_StridedShard(0, split_factor=2), Shard(0)), ("dp_shard", "tp"))
    assert pl["fc2.weight"] == ((Shard(0), Shard(1)), ("dp_shard", "tp"))
    assert pl["fc2.bias"] == ((Shard(0), Replicate()), ("dp_shard", "tp"))
    assert pl["layer_norm.weight"][0] == (Shard(0),)  # not TP-parallel: FSDP only


def test_hsdp_replicates_then_shards(fake_world):
    fake_world(4)
    pl = placements("hsdp2x2")
    assert pl["fc1.weight"] == ((Replicate(), Shard(0)), ("dp_replicate", "dp_shard"))


def test_fsdp_plain_shard(fake_world):
    fake_world(4)
    pl = placements("dp4", module="Linear")
    assert pl["proj.weight"] == ((Shard(0),), ("dp_shard",))


def test_bf16_mixed_precision_keeps_fp32_sharded_params(fake_world):
    fake_world(2)
    spec = parse_mesh("dp2")
    model = modules.build("LayerNormMLP", ModelDims(), seed=0)
    parallel.parallelize(model, parallel.device_mesh(spec, "cpu"), spec, "bf16")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert parallel.mixed_precision("bf16").param_dtype == torch.bfloat16
    assert parallel.mixed_precision("fp32") is None


def test_module_init_is_deterministic():
    a = modules.build("TransformerLayer", ModelDims(), seed=3).state_dict()
    b = modules.build("TransformerLayer", ModelDims(), seed=3).state_dict()
    c = modules.build("TransformerLayer", ModelDims(), seed=4).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert "self_attention.k.bias" not in a  # see modules.MultiheadAttention


def test_meta_built_model_is_materialized_and_stays_tied(fake_world):
    """The te backend builds on ``meta``; what no ``reset_parameters`` materializes (a plain
    ``nn.Embedding`` behind a tied head) gets storage, and the tie survives. Left on meta,
    ``set_model_state_dict`` would assign every tensor (quantized params replaced, ties cut)."""
    from harness.backends.te_backend import materialize
    from harness.distributed.modules import LlamaStack
    fake_world(2)
    spec = parse_mesh("dp2")
    with torch.device("meta"):
        model = LlamaStack(ModelDims(layers=1))
    parallel.shard(model, parallel.device_mesh(spec, "cpu"), spec, "fp32")
    materialize(model, "cpu")
    assert not [n for n, p in model.named_parameters() if p.is_meta]
    assert model.lm_head.weight is model.embed.weight
    assert torch.isfinite(model.embed.weight.to_local()).all()
