"""TE #2713: ``set_device_mesh`` turns TP-sharded parameters into DTensors.

TE modules do tensor parallelism themselves (local weight shards, their own collectives). For
DCP the shards must say where they belong: column-parallel weights/biases become
``Shard(0)`` DTensors on the TP mesh, row-parallel weights ``Shard(1)``, norms and row biases
``Replicate()``. FSDP2 then shards the TP dim-0 shards again with ``_StridedShard``. In forward
the module computes with the DTensor's local tensor *object itself* (``_ToLocalIdentity``, TE's
``_extract_trainable_tensor_from_dtensor``): FSDP2's backward re-gather refills that object in
place (a quantized weight gets its columnwise copy), and a ``to_local()`` view taken in forward
would not see it. Gradients flow back as DTensors.

Before the fix the local shards were plain parameters: DCP saves every TP rank's shard under
the same name and offsets as if they were replicas (deduplicated: a reload gives TP rank 1 the
shard of TP rank 0) and a reshard to a non-TP mesh sees the wrong shapes.
"""

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from harness.reference.fixes import on

NAME = "tp_dtensor_params"
PLACEMENT = {"column": Shard(0), "row": Shard(1), "replicate": Replicate()}


def set_device_mesh(module: nn.Module, tp_mesh, layout: dict[str, str]) -> None:
    """Convert ``module``'s own TP params (name -> 'column'|'row'|'replicate') to DTensors."""
    if not on(NAME) or tp_mesh is None:
        return
    for name, kind in layout.items():
        p = getattr(module, name)
        if p is None or isinstance(p, DTensor):
            continue
        d = DTensor.from_local(p.detach(), tp_mesh, [PLACEMENT[kind]], run_check=False)
        setattr(module, name, nn.Parameter(d, requires_grad=p.requires_grad))


class _ToLocalIdentity(torch.autograd.Function):
    """DTensor -> its very local tensor object; the gradient goes back as a DTensor."""

    @staticmethod
    def forward(ctx, d):
        ctx.spec = (d.device_mesh, d.placements, d.shape, d.stride())
        return d._local_tensor

    @staticmethod
    def backward(ctx, g):
        mesh, placements, shape, stride = ctx.spec
        return DTensor.from_local(g, mesh, placements, shape=shape, stride=stride,
                                  run_check=False)


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor a module computes with: the local shard of a DTensor param."""
    if not isinstance(t, DTensor):
        return t
    return _ToLocalIdentity.apply(t) if t.requires_grad else t._local_tensor
