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
    through the dequantized values only; the detail names them.
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
from harness.distributed.run import full, is_quantized, raw_buffers


def _local(t):
    return t._local_tensor if isinstance(t, DTensor) else t


def quantized_allgather_parity(run, rec) -> None:
    params = [(n, p) for n, p in run.model.named_parameters() if is_quantized(_local(p))]
    rec.flag("quantized_allgather_parity", "has_quantized_params", bool(params),
             f"{len(params)} quantized parameters")
    if not params:
        return
    manual = {n: full(p) for n, p in params}  # each shard dequantized with its own scale
    shard_raw = _gather_shard_buffers(params)
    gathered, bad, raw_got, raw_want, skipped = {}, [], {}, {}, []
    with wire.recording() as moved, unsharded(run.model) as params_now:
        for n, _ in params:
            u = params_now[n]
            if not is_quantized(_local(u)):
                bad.append(f"{n}: unsharded parameter is a plain {_local(u).dtype} tensor: FSDP2 "
                           f"gathered dequantized values")
                continue
            gathered[n] = full(u)
            for k, v in raw_buffers(_local(u)).items():
                if f"{n}#{k}" in shard_raw:
                    raw_got[f"{n}#{k}"], raw_want[f"{n}#{k}"] = v, shard_raw[f"{n}#{k}"]
                else:
                    skipped.append(f"{n}#{k}")
    record_wire(rec, moved, [n for n, _ in params], run.case.recipe)
    rec.flag("quantized_allgather_parity", "quantized_unshard", not bad,
             "; ".join(bad) or "every unsharded weight is quantized")
    if gathered:
        rec.compare("quantized_allgather_parity", "dequantized_vs_manual_gather", gathered,
                    {n: manual[n] for n in gathered}, tolerances.BITWISE)
        rec.compare("quantized_allgather_parity", "raw_vs_manual_gather", raw_got, raw_want,
                    tolerances.BITWISE)
        if skipped:
            rec.note("quantized_allgather_parity", "raw_not_compared",
                     "compared through the dequantized values only (layout not by rows): "
                     + ", ".join(skipped[:8]))


def _gather_shard_buffers(params) -> dict:
    """Every shard's raw buffers assembled like the parameter: buffers with one row per row of
    the shard (rowwise data) or one per block of rows (block scales) to full size, per-tensor
    scalars as one value when every shard agrees (else one per rank, which then differs from
    the gathered tensor's single value). Collective (one object all-gather)."""
    from harness.distributed.gather import Gather
    g = Gather()
    for n, p in params:
        local = _local(p)
        if not isinstance(p, DTensor) or not local.shape or not local.shape[0]:
            continue
        rows_full, rows_local = p.shape[0], local.shape[0]
        for k, v in raw_buffers(local).items():
            if v.numel() == 1:
                g.add_scalar(f"{n}#{k}", v)
            elif v.dim() and v.shape[0] and rows_full % rows_local == 0 and (
                    v.shape[0] == rows_local or rows_local % v.shape[0] == 0) \
                    and "transpose" not in k and "columnwise" not in k:
                full_rows = v.shape[0] * rows_full // rows_local
                g.add(f"{n}#{k}", p, v, (full_rows, *v.shape[1:]))
    return g.run()


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
