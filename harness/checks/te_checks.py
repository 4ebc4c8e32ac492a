"""Checks of TransformerEngine quantized parameters (te backend), the TE counterparts of
checks/quantized.py. TE tensors expose ``dequantize()`` and their raw buffers through
``get_metadata()``; shards are compared as TE's own FSDP2 tests do, but bitwise.

quantized_allgather_parity
    FSDP2's unshard of each quantized weight is a TE quantized tensor (raw bytes were gathered,
    ``bytes_on_wire`` says how many) whose raw buffers -- rowwise data and scales -- equal, bit
    for bit, the manual gather of the shards' own buffers (``raw_vs_manual_gather``: data laid
    out like the parameter, per-tensor scales agreed by every shard, block scales by rows), and
    whose dequantized values equal the gather of each shard's dequantized values. Buffers whose
    layout does not follow the rows of the shard (transposes, columnwise copies) are compared
    through the dequantized values only; the detail names them. ``shards_share_scale``: every
    shard (FSDP and TP pieces) holds the same per-tensor scale. With TP the unshard is the TP
    rank's piece; both sides are then assembled to the whole parameter.
weights_only_load
    the quantized shards survive ``torch.save`` -> ``torch.load(weights_only=True)`` with
    identical raw buffers (every one ``get_metadata()`` holds) and values. TE does not pickle
    caches it can rebuild (a Float8Tensor's transpose); those are rebuilt on the loaded tensor
    (``update_usage``, as a GEMM would) and compared too (``rebuilt_buffers``).
"""

from __future__ import annotations

import io

import torch
from torch.distributed.tensor import DTensor

from harness.calibration import tolerances
from harness.checks import wire
from harness.checks.quantized import record_wire, unsharded
from harness.distributed.gather import entries
from harness.distributed.run import flatten, full, is_quantized, raw_buffers


def _local(t):
    return t._local_tensor if isinstance(t, DTensor) else t


def quantized_allgather_parity(run, rec) -> None:
    params = [(n, p) for n, p in run.model.named_parameters() if is_quantized(_local(p))]
    rec.flag("quantized_allgather_parity", "has_quantized_params", bool(params),
             f"{len(params)} quantized parameters")
    if not params:
        return
    # each shard dequantized with its own scale, one gather; shards whose regions collide (TP
    # pieces that are no DTensors) leave replicas_diverge entries that the comparison is given
    manual = flatten(dict(params), raw=False)
    shard_raw, scalars = _gather_buffers(params)
    gathered, bad, unsharded_now = {}, [], []
    with wire.recording() as moved, unsharded(run.model) as params_now:
        for n, _ in params:
            u = params_now[n]
            if not is_quantized(_local(u)):
                bad.append(f"{n}: unsharded parameter is a plain {_local(u).dtype} tensor: FSDP2 "
                           f"gathered dequantized values")
                continue
            gathered[n] = full(u)
            unsharded_now.append((n, u))
        # with TP the unshard is the TP rank's piece (a DTensor over the TP mesh): its buffers
        # are assembled the same way, so both sides are whole tensors
        got_raw, _ = _gather_buffers(unsharded_now)
        got_keys = _all_buffer_keys(unsharded_now)  # while the unsharded storage lives
    # every buffer the shards have must come out of the unshard (a missing one is a difference)
    raw_want = {k: v for k, v in shard_raw.items() if k.split("#", 1)[0] in gathered}
    raw_got = {k: v for k, v in got_raw.items() if k in raw_want}
    skipped = sorted(set(got_keys) - set(raw_got))
    record_wire(rec, moved, [n for n, _ in params], run.case.recipe)
    # a per-tensor scale must come from the whole weight's amax: every shard -- FSDP and TP
    # pieces alike -- holds the same one (with TP the unshard is still a piece, so comparing
    # it with the shards would not see TP pieces that each scale for themselves)
    split = {k: shard_raw[k] for k in scalars if shard_raw[k].numel() > 1}
    rec.flag("quantized_allgather_parity", "shards_share_scale", not split,
             "; ".join(f"{k}: {v.flatten().tolist()} (by rank)" for k, v in
                       list(split.items())[:4]) or f"{len(scalars)} per-tensor values agree")
    rec.flag("quantized_allgather_parity", "quantized_unshard", not bad,
             "; ".join(bad) or "every unsharded weight is quantized")
    if gathered:
        rec.compare("quantized_allgather_parity", "dequantized_vs_manual_gather", gathered,
                    entries(manual, gathered), tolerances.BITWISE)
        rec.compare("quantized_allgather_parity", "raw_vs_manual_gather", raw_got, raw_want,
                    tolerances.BITWISE)
        if skipped:
            rec.note("quantized_allgather_parity", "raw_not_compared",
                     "compared through the dequantized values only (layout not by rows): "
                     + ", ".join(skipped[:8]))


def _gather_buffers(params) -> tuple[dict, list]:
    """Every (sharded or unsharded) parameter's raw buffers assembled like the whole parameter:
    buffers laid out like the piece (rowwise data) or one per block of rows (block scales) to
    full size, per-tensor scalars as one value when every piece agrees (else one per rank,
    which then differs from the whole tensor's single value). Buffers that cannot be placed
    (transposes, columnwise copies, block scales across a sharded column dim) are left out.
    A plain tensor is already whole. Returns the buffers and the keys of per-tensor scalars.
    Collective (one object all-gather)."""
    from harness.distributed.gather import Gather
    g, out, scalars = Gather(), {}, []
    for n, p in params:
        local = _local(p)
        for k, v in raw_buffers(local).items():
            if not isinstance(p, DTensor):
                out[f"{n}#{k}"] = v
            elif v.numel() == 1:
                g.add_scalar(f"{n}#{k}", v)
                scalars.append(f"{n}#{k}")
            elif (shape := _whole_shape(k, v, local, p)) is not None:
                g.add(f"{n}#{k}", p, v, shape)
    out.update(g.run())
    return out, scalars


def _all_buffer_keys(params):
    return [f"{n}#{k}" for n, p in params for k in raw_buffers(_local(p))]


def _whole_shape(key: str, v, local, p):
    """The shape ``v`` (a buffer of ``p``'s local piece) has for the whole ``p``, or None.
    Along a sharded dim the buffer must follow the piece: the same length (rowwise data, also
    where the shards are uneven), or along dim 0 one entry per block of rows (block scales) of
    even shards; unsharded dims keep their length. Every rank decides alike (they gather one
    set of keys): by the whole shape and the shard counts, not by its own piece's size."""
    if "transpose" in key or "columnwise" in key or v.dim() != local.dim() or not local.shape:
        return None
    shards: dict[int, int] = {}
    for j, pl in enumerate(p.placements):
        if pl.is_shard():
            shards[pl.dim] = shards.get(pl.dim, 1) * p.device_mesh.size(j)
    shape = []
    for i, (n, part, whole) in enumerate(zip(v.shape, local.shape, p.shape)):
        if i not in shards:
            shape.append(n)
        elif n == part:
            shape.append(whole)
        elif i == 0 and n and whole % shards[i] == 0 and part % n == 0:
            shape.append(n * whole // part)
        else:
            return None
    return tuple(shape)


def weights_only_load(run, rec) -> None:
    saved = {n: _local(p).detach() for n, p in run.model.named_parameters()
             if is_quantized(_local(p))}
    buf = io.BytesIO()
    torch.save(saved, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    lazy = tuple(getattr(run.backend, "lazy_buffers", ()))
    before, after, lost, rebuilt = {}, {}, {}, {}
    for n, t in saved.items():
        b = raw_buffers(t)
        got = loaded[n]
        a = raw_buffers(got) if is_quantized(got) else {}
        missing = [k for k in b if k not in a and any(f in k for f in lazy)]
        before.update({f"{n}#{k}": v for k, v in b.items() if k not in missing})
        before[f"{n}#dequantized"] = t.dequantize().cpu()
        after.update({f"{n}#{k}": v for k, v in a.items()})
        after[f"{n}#dequantized"] = got.dequantize().cpu() if hasattr(got, "dequantize") else got
        if missing:
            lost.update({f"{n}#{k}": b[k] for k in missing})
            _rebuild(got)
            again = raw_buffers(got)
            rebuilt.update({f"{n}#{k}": again[k] for k in missing if k in again})
    rec.compare("weights_only_load", "raw_parts", after, before, tolerances.BITWISE)
    if lost:
        rec.compare("weights_only_load", "rebuilt_buffers", rebuilt, lost, tolerances.BITWISE)


def _rebuild(t) -> None:
    """Ask TE to build every usage the tensor can have (what the next GEMM would)."""
    if hasattr(t, "update_usage"):
        t.update_usage(rowwise_usage=True, columnwise_usage=True)


CHECKS = {"quantized_allgather_parity": quantized_allgather_parity,
          "weights_only_load": weights_only_load}
