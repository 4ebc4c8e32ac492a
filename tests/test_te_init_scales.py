"""Workaround current_scale_group (backends/te_init_scales.py) without TE: which weight shards
get the FSDP shard group as their tensor-level amax group before the initial load."""

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from harness.backends import te_init_scales


class Float8CurrentScalingQuantizer:  # stands for TE's class: the workaround goes by its name
    pass


class Float8BlockQuantizer:
    pass


def _model(mesh, placements, quantizers):
    m = nn.Module()
    for i, q in enumerate(quantizers):
        p = nn.Parameter(DTensor.from_local(torch.zeros(4, 4), mesh, placements, run_check=False))
        if q is not None:
            p._local_tensor._quantizer = q()
        m.register_parameter(f"w{i}", p)
    return m


def test_current_scaling_shards_of_an_fsdp_mesh_get_its_group(fake_world):
    fake_world(4)
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("dp_shard",))
    m = _model(mesh, [Shard(0)], [Float8CurrentScalingQuantizer, Float8BlockQuantizer, None])
    assert te_init_scales.apply(m) == 1
    assert m.w0._local_tensor.amax_reduction_group is mesh.get_group()
    assert not hasattr(m.w1._local_tensor, "amax_reduction_group")  # block: per-block scales
    assert not hasattr(m.w2._local_tensor, "amax_reduction_group")  # not quantized
    assert te_init_scales.apply(m) == 0  # a group already set is kept


def test_hsdp_takes_the_shard_dim_and_tp_is_left_to_the_port(fake_world):
    fake_world(4)
    hsdp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    m = _model(hsdp, [Shard(0), Shard(0)], [Float8CurrentScalingQuantizer])
    assert te_init_scales.apply(m) == 1
    assert m.w0._local_tensor.amax_reduction_group is hsdp.get_group("dp_shard")
    tp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    m = _model(tp, [Shard(0), Shard(1)], [Float8CurrentScalingQuantizer])
    assert te_init_scales.apply(m) == 0
    assert getattr(m.w0._local_tensor, "amax_reduction_group", None) is None


def test_the_backends_own_dim_names(fake_world):
    fake_world(4)
    names = {"dp_replicate": "replicate", "dp_shard": "shard", "tp": "tp"}  # TE's workaround
    hsdp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    m = _model(hsdp, [Shard(0), Shard(0)], [Float8CurrentScalingQuantizer])
    assert te_init_scales.apply(m, names) == 1
    assert m.w0._local_tensor.amax_reduction_group is hsdp.get_group("shard")
