"""Whole tensors from DTensor shards for the checks, many at once.

Each rank contributes its local piece with the offsets DTensor (and DCP) assign it -- Shard,
_StridedShard, Replicate alike -- and one object all-gather over the default group moves every
piece of a batch (gloo on CPU). The harness's own gathers thus stay off the functional
collectives that FSDP2 / DTensor under test use (one such wait segfaulted under CI load), and a
whole state dict costs one collective, not one per tensor.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

_SCALAR = "scalar"


class Gather:
    def __init__(self):
        self._items: dict[str, tuple] = {}

    def add(self, key: str, d: DTensor, local: torch.Tensor, shape=None) -> None:
        """Gather ``local`` pieces laid out like DTensor ``d`` into a tensor of ``shape``."""
        shape = tuple(d.shape if shape is None else shape)
        sizes, offsets = compute_local_shape_and_global_offset(shape, d.device_mesh, d.placements)
        self._items[key] = (shape, tuple(offsets), tuple(sizes), local.detach().cpu())

    def add_scalar(self, key: str, value: torch.Tensor) -> None:
        """A per-rank value that should agree: one value if all ranks agree, else all of them."""
        self._items[key] = (_SCALAR, None, None, value.detach().cpu())

    def run(self) -> dict[str, torch.Tensor]:
        if not self._items:
            return {}
        pieces = [None] * dist.get_world_size()
        dist.all_gather_object(pieces, self._items)
        out = {}
        for key, (shape, _, _, mine) in self._items.items():
            if shape == _SCALAR:
                vals = [p[key][3] for p in pieces]
                same = all(_bits_equal(v, vals[0]) for v in vals)
                out[key] = vals[0].clone() if same else torch.stack(vals)
                continue
            full = torch.zeros(shape, dtype=mine.dtype)
            for p in pieces:
                _, offs, szs, loc = p[key]
                full[tuple(slice(o, o + n) for o, n in zip(offs, szs))] = loc.reshape(szs)
            out[key] = full
        return out


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                              b.reshape(-1).view(torch.uint8))
