"""Whole tensors from DTensor shards for the checks, many at once, on rank 0.

Each rank contributes its local piece with the offsets DTensor (and DCP) assign it -- Shard,
_StridedShard, Replicate alike -- and one gather over the worker's gloo exchange group moves every
piece of a batch to rank 0 (gloo on CPU). The harness's own gathers thus stay off the functional
collectives that FSDP2 / DTensor under test use (one such wait segfaulted under CI load), and a
whole state dict costs one collective, not one per tensor.

**Whole tensors live on rank 0.** Every rank would otherwise assemble and compare the same whole
tensors -- work that grows with the world size on every rank and bought nothing (at 8 ranks
sharing a host's CPUs, 7 copies of every comparison). The other ranks get *placeholders*: meta
tensors of the whole tensor's shape and dtype (:func:`held` tells them apart), so shapes, dtypes
and keys stay known everywhere, comparisons skip their values there (``checks/compare.py``), and
any use of a placeholder's values (``.item()``, ``torch.equal``, ``nonzero``) raises instead of
passing silently. Rank-local values (a rank's own raw buffers, ``#local.`` keys) are real on
every rank.

Replicas must agree: where several ranks hold the same region (the HSDP replicate dim, weights
TP leaves replicated such as norms and biases), every copy must have the same bytes. A region
whose copies differ is reported under an extra key ``<key>#replicas_diverge(...)`` naming the
ranks and the first differing index -- a key no reference has, so the comparison fails there.
"""

from __future__ import annotations

import pickle

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

_SCALAR = "scalar"
# The group the gathers run on: the worker sets its gloo exchange group (CPU pickles over gloo;
# on GPU the default group's object collectives would round-trip through NCCL device tensors).
GROUP = None


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
        """Whole tensors on rank 0, placeholders (meta tensors) on the other ranks."""
        if not self._items:
            return {}
        pieces = _gather_to_rank0(self._items)
        if pieces is None:
            return {key: torch.empty(mine.shape if shape == _SCALAR else shape,
                                     dtype=mine.dtype, device="meta")
                    for key, (shape, _, _, mine) in self._items.items()}
        out = {}
        for key, (shape, _, _, mine) in self._items.items():
            if shape == _SCALAR:
                vals = [p[key][3] for p in pieces]
                same = all(_bits_equal(v, vals[0]) for v in vals)
                out[key] = vals[0].clone() if same else torch.stack(vals)
                continue
            full = torch.zeros(shape, dtype=mine.dtype)
            holder: dict[tuple, tuple[int, torch.Tensor]] = {}
            for rank, p in enumerate(pieces):
                _, offs, szs, loc = p[key]
                loc = loc.reshape(szs)
                region = (offs, szs)
                if region in holder and not _bits_equal(holder[region][1], loc):
                    first, other = holder[region]
                    out[f"{key}#replicas_diverge(ranks {first} vs {rank} at offset "
                        f"{list(offs)}: {_first_diff(other, loc)})"] = "diverged"
                    continue
                holder.setdefault(region, (rank, loc))
                full[tuple(slice(o, o + n) for o, n in zip(offs, szs))] = loc
            out[key] = full
        return out


def entries(result: dict, keys) -> dict:
    """A gather's ``result`` for ``keys`` (those it has), each with the entries that say its
    replicas diverged (none where they agree): a comparison given them fails, naming the ranks
    and the region."""
    out = {}
    for key in keys:
        if key in result:
            out[key] = result[key]
        out.update({k: v for k, v in result.items() if k.startswith(f"{key}#replicas_diverge(")})
    return out


def held(t) -> bool:
    """Whether ``t`` holds values on this rank (not a placeholder of a whole tensor that only
    rank 0 holds)."""
    return not (isinstance(t, torch.Tensor) and t.is_meta)


_HEAD = 8  # the length of a rank's pickled layout, at the start of its buffer


def _gather_to_rank0(items: dict[str, tuple]) -> list[dict[str, tuple]] | None:
    """Every rank's ``items`` (key -> (shape, offsets, sizes, local tensor)) on rank 0, None
    elsewhere. Each rank packs its layout (pickled: keys, offsets, dtypes, sizes) and every
    local piece into one byte buffer; one 8-byte all_reduce finds the longest, one ``gather``
    brings the buffers to rank 0 (no pickled tensors: the copies and the pickling cost more
    than the wire on one host)."""
    layout = {k: (shape, offs, szs, t.dtype, tuple(t.shape), t.numel() * t.element_size())
              for k, (shape, offs, szs, t) in items.items()}
    head = pickle.dumps(layout, protocol=pickle.HIGHEST_PROTOCOL)
    start = _padded(_HEAD + len(head))
    size = torch.tensor([start + sum(_padded(n) for *_, n in layout.values())], dtype=torch.int64)
    dist.all_reduce(size, op=dist.ReduceOp.MAX, group=GROUP)
    mine = torch.zeros(int(size), dtype=torch.uint8)
    mine[:_HEAD] = torch.tensor([len(head)], dtype=torch.int64).view(torch.uint8)
    mine[_HEAD:_HEAD + len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    at = start
    for *_, t in items.values():  # each piece copied once, into its aligned place
        b = _as_bytes(t)
        mine[at:at + b.numel()] = b
        at += _padded(b.numel())
    root = 0 if GROUP is None else dist.get_global_rank(GROUP, 0)
    if dist.get_rank() != root:
        dist.gather(mine, None, dst=root, group=GROUP)
        return None
    bufs = [torch.empty_like(mine) for _ in range(dist.get_world_size(group=GROUP))]
    dist.gather(mine, bufs, dst=root, group=GROUP)
    out = []
    for buf in bufs:
        n = int(buf[:_HEAD].view(torch.int64))
        lay = pickle.loads(buf[_HEAD:_HEAD + n].numpy().tobytes())
        at, got = _padded(_HEAD + n), {}
        for k, (shape, offs, szs, dtype, local_shape, nbytes) in lay.items():
            raw = buf[at:at + nbytes]
            at += _padded(nbytes)
            got[k] = (shape, offs, szs, raw.view(dtype).reshape(local_shape) if nbytes
                      else torch.empty(local_shape, dtype=dtype))
        out.append(got)
    return out


ALIGN = 16  # every piece starts aligned, so its bytes can be viewed as its dtype


def _padded(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)


def _first_diff(a: torch.Tensor, b: torch.Tensor) -> str:
    fa, fb = a.reshape(-1), b.reshape(-1)
    ne = (fa.view(torch.uint8).reshape(fa.numel(), -1) !=
          fb.view(torch.uint8).reshape(fb.numel(), -1)).any(dim=1) if fa.numel() else fa.bool()
    i = int(ne.nonzero()[0]) if bool(ne.any()) else 0
    return f"flat index {i}: {fa[i].item():.9g} vs {fb[i].item():.9g}" if fa.numel() else "empty"


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                              b.reshape(-1).view(torch.uint8))


def on_rank0(ctx, fn) -> None:
    """Run ``fn`` on rank 0 only; if it raises, every rank raises (no rank is left waiting in
    a collective the others never reach)."""
    err = None
    if ctx.rank == 0:
        try:
            fn()
        except Exception as e:  # re-raised below, on every rank
            err = e
    flag = [repr(err) if err else None]
    dist.broadcast_object_list(flag, src=0, group=ctx.exchange)
    if err is not None:
        raise err
    if flag[0] is not None:
        raise RuntimeError(f"rank 0 failed: {flag[0]}")
