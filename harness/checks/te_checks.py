"""Checks of TransformerEngine quantized parameters (te backend), the TE counterparts of
checks/quantized.py. TE tensors expose ``dequantize()`` and their raw buffers through
``get_metadata()``; shards are compared as TE's own FSDP2 tests do, but bitwise.

quantized_allgather_parity
    FSDP2's unshard of each quantized weight is a TE quantized tensor (raw bytes were gathered)
    whose dequantized values equal, bit for bit, the gather of each shard's own dequantized
    values (one scale per tensor across shards, no re-quantization on the way).
weights_only_load
    the quantized shards survive ``torch.save`` -> ``torch.load(weights_only=True)`` with
    identical raw buffers and values.
"""

from __future__ import annotations

import io

import torch
from torch.distributed.tensor import DTensor

from .. import tolerances
from ..worker.run import full, is_quantized, raw_buffers
from .quantized import unsharded


def _local(t):
    return t._local_tensor if isinstance(t, DTensor) else t


def quantized_allgather_parity(run, rec) -> None:
    params = [(n, p) for n, p in run.model.named_parameters() if is_quantized(_local(p))]
    rec.flag("quantized_allgather_parity", "has_quantized_params", bool(params),
             f"{len(params)} quantized parameters")
    if not params:
        return
    manual = {n: full(p) for n, p in params}  # each shard dequantized with its own scale
    gathered, bad = {}, []
    with unsharded(run.model) as params_now:
        for n, _ in params:
            u = params_now[n]
            if not is_quantized(_local(u)):
                bad.append(f"{n}: unsharded parameter is a plain {_local(u).dtype} tensor: FSDP2 "
                           f"gathered dequantized values")
                continue
            gathered[n] = full(u)
    rec.flag("quantized_allgather_parity", "quantized_unshard", not bad,
             "; ".join(bad) or "every unsharded weight is quantized")
    if gathered:
        rec.compare("quantized_allgather_parity", "dequantized_vs_manual_gather", gathered,
                    {n: manual[n] for n in gathered}, tolerances.BITWISE)


def weights_only_load(run, rec) -> None:
    saved = {n: _local(p).detach() for n, p in run.model.named_parameters()
             if is_quantized(_local(p))}
    buf = io.BytesIO()
    torch.save(saved, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    before, after = {}, {}
    for n, t in saved.items():
        before.update({f"{n}#{k}": v for k, v in raw_buffers(t).items()})
        before[f"{n}#dequantized"] = t.dequantize().cpu()
        got = loaded[n]
        after.update({f"{n}#{k}": v for k, v in raw_buffers(got).items()})
        after[f"{n}#dequantized"] = got.dequantize().cpu() if hasattr(got, "dequantize") else got
    rec.compare("weights_only_load", "raw_parts", after, before, tolerances.BITWISE)


CHECKS = {"quantized_allgather_parity": quantized_allgather_parity,
          "weights_only_load": weights_only_load}
