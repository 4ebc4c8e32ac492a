"""A column-parallel output made whole: the TP shards of the last dim gathered with c10d.

``gather_last_dim(t, group)`` is what ``DTensor.from_local(t, tp_mesh, [Shard(-1)]).full_tensor()``
computes, forward and backward (the backward hands each rank its slice of the gradient, as
DTensor's Replicate -> Shard does), but through ``dist.all_gather`` on the group rather than
the functional collectives: over a gloo group on CUDA tensors -- ranks sharing a GPU -- the
functional all_gather_tensor segfaults inside AsyncCollectiveTensor (torch 2.11), where c10d
works. The collective is bounded by the process group's timeout like every other.
``ColwiseGathered`` is ``ColwiseParallel(output_layouts=Replicate())`` gathering that way.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel


class _GatherLastDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        n, r = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return grad.chunk(n, dim=-1)[r].contiguous(), None


def gather_last_dim(t: torch.Tensor, group) -> torch.Tensor:
    """``t``'s TP shards (equal sizes along the last dim) concatenated in rank order."""
    return _GatherLastDim.apply(t, group)


class ColwiseGathered(ColwiseParallel):
    """``ColwiseParallel(output_layouts=Replicate())`` -- the same shards, the same whole output,
    forward and backward -- with the output's Shard(-1) -> Replicate step done by
    ``gather_last_dim`` (c10d) instead of DTensor's redistribute (a functional all-gather)."""

    def __init__(self, *, input_layouts=None, use_local_output: bool = True):
        super().__init__(input_layouts=input_layouts, use_local_output=use_local_output)

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        whole = gather_last_dim(outputs.to_local(), device_mesh.get_group())
        if use_local_output:
            return whole
        return DTensor.from_local(whole, device_mesh, [Replicate()], run_check=False)


def c10d_gathered(style):
    """``style`` with its output gathered by c10d where it is a ColwiseParallel that gathers
    its output (``output_layouts=Replicate()``); any other style as it is."""
    if type(style) is ColwiseParallel and tuple(style.output_layouts) == (Replicate(),):
        return ColwiseGathered(input_layouts=style.input_layouts[0],
                               use_local_output=style.use_local_output)
    return style


class _SumOverGroup(torch.autograd.Function):
    """Forward: the sum of every rank's ``x``; backward: the gradient as it is (every rank
    computes the same loss from the same replicated sum)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def sum_over_group(x: torch.Tensor, group) -> torch.Tensor:
    """Every rank's ``x`` summed (a row-parallel GEMM's partial outputs); identity backward."""
    return _SumOverGroup.apply(x, group)


def vocab_sharded_lookup(ids: torch.Tensor, rows: torch.Tensor, start: int, group):
    """``F.embedding`` of ``ids`` in a vocabulary sharded by rows over ``group``: this rank
    holds ``rows``, vocabulary ids ``start`` onwards; it looks up the ids it holds, zero
    elsewhere, and the pieces are summed."""
    outside = (ids < start) | (ids >= start + rows.shape[0])
    h = torch.nn.functional.embedding((ids - start).masked_fill(outside, 0), rows)
    return sum_over_group(h.masked_fill(outside.unsqueeze(-1), 0.0), group)


def vocab_sharded_embedding(ids: torch.Tensor, weight, group) -> torch.Tensor:
    """``F.embedding(ids, whole weight)`` from a weight whose vocabulary rows are sharded over
    ``group`` (a DTensor ``Shard(0)``, as ``RowwiseParallel`` leaves an ``nn.Embedding``): each
    rank looks up the ids its rows hold, zero elsewhere, and the pieces are summed with c10d
    (``RowwiseParallel``'s own output step is a functional all-reduce; see above)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    local = weight.to_local() if isinstance(weight, DTensor) else weight
    _, (start, _) = compute_local_shape_and_global_offset(
        weight.shape, weight.device_mesh, weight.placements)
    return vocab_sharded_lookup(ids, local, start, group)
