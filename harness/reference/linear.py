"""The emulated quantized GEMM and the TE-style tensor-parallel collectives.

``quantized_linear(x, w, b, ...)`` computes ``x @ W^T + b`` with every GEMM operand quantized
the way the recipe says (quantizers.py), dequantized, and multiplied in fp32:

    forward  y  = q_row(x)  @ W_row^T          (contract over in_features)
    dgrad    dx = q_row(dy) @ W_col            (contract over out_features: columnwise W)
    wgrad    dW = q_col(dy)^T @ q_col(x)       (contract over tokens)

``W`` is either a QuantizedTensor (quantized primary weights, e.g. as FSDP2 all-gathered it) or a
high-precision tensor that is quantized on the fly. Outside ``autocast`` (or with recipe fp32)
it is a plain matmul.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from harness.distributed.tp_output import gather_last_dim, sum_over_group
from harness.reference.qtensor import QuantizedTensor
from harness.reference.quantizers import QuantState, WeightQuantizer, fake_quant

_ENABLED = [False]


@contextlib.contextmanager
def autocast(enabled: bool = True):
    """Like ``te.autocast``: inside, modules of quantized recipes run quantized GEMMs."""
    prev = _ENABLED[0]
    _ENABLED[0] = enabled
    try:
        yield
    finally:
        _ENABLED[0] = prev


def _weight(w: torch.Tensor, usage: str, quantizer: WeightQuantizer | None) -> torch.Tensor:
    if isinstance(w, QuantizedTensor):
        return w.dequantize(usage, torch.float32)
    if quantizer is None:
        return w.to(torch.float32)
    parts = quantizer.parts(w, {usage})
    return quantizer.codec.dequantize(parts, tuple(w.shape), usage)


class _QuantizedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, recipe, state, quantizer, world_group):
        x2 = x.reshape(-1, x.shape[-1]).to(torch.float32)
        x_row, x_col = fake_quant(x2, recipe, "input", (-1, 0), state, world_group)
        y = x_row @ _weight(w, "row", quantizer).t()
        if b is not None:
            y = y + b.to(torch.float32)
        ctx.save_for_backward(x_col, w)
        ctx.meta = (recipe, state, quantizer, world_group, b is not None, x.shape, x.dtype)
        return y.reshape(*x.shape[:-1], -1).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x_col, w = ctx.saved_tensors
        recipe, state, quantizer, world_group, has_bias, x_shape, x_dtype = ctx.meta
        g = dy.reshape(-1, dy.shape[-1]).to(torch.float32)
        g_row, g_col = fake_quant(g, recipe, "grad", (-1, 0), state, world_group)
        dx = g_row @ _weight(w, "col", quantizer)
        dw = g_col.t() @ x_col
        db = g.sum(0) if has_bias else None
        return dx.reshape(x_shape).to(x_dtype), dw.to(w.dtype), db, None, None, None, None


def quantized_linear(x, w, b, recipe: str, state: QuantState | None,
                     quantizer: WeightQuantizer | None, world_group=None):
    if not _ENABLED[0] or recipe in ("fp32", "bf16"):
        wt = w.dequantize() if isinstance(w, QuantizedTensor) else w
        return torch.nn.functional.linear(x, wt, b)
    return _QuantizedLinear.apply(x, w, b, recipe, state, quantizer, world_group)


# --- tensor parallelism (Megatron / TE style: the module owns its collectives) -----------------
class _CopyToTP(torch.autograd.Function):
    """Identity forward; sums input gradients over TP (before a column-parallel GEMM)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g, group=ctx.group)
        return g, None


def copy_to_tp(x, group):
    return _CopyToTP.apply(x, group) if group is not None else x


def reduce_from_tp(x, group):
    """Sums partial outputs over TP (after a row-parallel GEMM); identity backward."""
    return sum_over_group(x, group) if group is not None else x


def gather_from_tp(x, group):
    """All-gathers a column-parallel output along its last dim; backward keeps this rank's
    slice."""
    return gather_last_dim(x, group) if group is not None else x
