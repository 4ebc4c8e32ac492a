"""Deterministic synthetic data: the global batch of a step depends only on (seed, step)."""

from __future__ import annotations

import torch

from ..mesh import MeshSpec
from ..spec import ModelDims


def out_width(kind: str, dims: ModelDims) -> int:
    """Linear / LayerNormLinear map hidden -> out_features; the other modules keep hidden."""
    return dims.out_features if kind in ("Linear", "LayerNormLinear") else dims.hidden


def global_batch(kind: str, dims: ModelDims, seed: int, step: int):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(dims.batch, dims.seq, dims.hidden, generator=g)
    y = torch.randn(dims.batch, dims.seq, out_width(kind, dims), generator=g)
    return x, y


def local_batch(kind: str, dims: ModelDims, seed: int, step: int, mesh: MeshSpec | None, rank: int,
                device):
    """This rank's slice of the global batch; TP ranks of one data-parallel group share it.
    ``mesh=None`` gives the whole global batch (the single-process reference)."""
    x, y = global_batch(kind, dims, seed, step)
    if mesh is not None:
        n = dims.batch // mesh.dp_size
        i = mesh.dp_index(rank)
        x, y = x[i * n:(i + 1) * n], y[i * n:(i + 1) * n]
    return x.to(device), y.to(device)
