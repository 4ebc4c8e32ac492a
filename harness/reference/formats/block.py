"""FP8 block scaling reference (like TE ``Float8BlockScaling``).

A 2-D tensor ``[M, N]`` is tiled into blocks of ``block = (b0, b1)`` elements:
``(1, 128)`` (one scale per 128 consecutive elements of a row) for activations
and gradients, ``(128, 128)`` tiles for weights. Each block gets its own fp32
scale mapping the block's amax onto the FP8 maximum::

    amax_b  = max(|x| over the block, eps)
    scale_b = fmt.max / amax_b            (amax_b == 0 or non-finite -> 1.0;
                                           fp32 overflow -> fp32 max)
    scale_b = 2**floor(log2(scale_b))     (only if power_of_2_scales)
    q       = saturating_cast(x * scale_b)    scale_inv_b = 1 / scale_b

Blocks at the right/bottom edge may be partial (``M % b0 != 0`` or
``N % b1 != 0``): their amax is taken over the existing elements only, and the
scale tensor has ``ceil(M / b0) x ceil(N / b1)`` entries.

Inputs that are not 2-D are viewed as ``(prod(shape[:-1]), shape[-1])``
(a 1-D tensor becomes a single row, a 0-D tensor ``(1, 1)``); outputs are 2-D.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from harness.reference.formats.fp8 import E4M3, FP8Format, saturating_cast

__all__ = ["as_2d", "block_amax", "expand_blocks", "quantize_blockwise", "dequantize_blockwise"]

_F32_MAX = torch.finfo(torch.float32).max


def as_2d(x: torch.Tensor) -> torch.Tensor:
    """View ``x`` as ``(prod(shape[:-1]), shape[-1])``; 0-D -> ``(1, 1)``."""
    if x.dim() == 0:
        return x.reshape(1, 1)
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def block_amax(x2d: torch.Tensor, b0: int, b1: int) -> torch.Tensor:
    """fp32 ``[ceil(M/b0), ceil(N/b1)]`` absolute max per block (partial blocks ok).

    Edge blocks are zero-padded, which does not change an absolute max.
    NaN in a block gives a NaN amax for that block.
    """
    M, N = x2d.shape
    mb, nb = -(-M // b0), -(-N // b1)
    a = x2d.detach().to(torch.float32).abs()
    if mb == 0 or nb == 0:
        return a.new_zeros((mb, nb))
    a = F.pad(a, (0, nb * b1 - N, 0, mb * b0 - M))
    return a.reshape(mb, b0, nb, b1).amax(dim=(1, 3))


def expand_blocks(per_block: torch.Tensor, b0: int, b1: int, shape) -> torch.Tensor:
    """Broadcast a per-block tensor back to the element grid ``shape = (M, N)``."""
    M, N = shape
    out = per_block.repeat_interleave(b0, dim=0).repeat_interleave(b1, dim=1)
    return out[:M, :N]


def quantize_blockwise(x2d: torch.Tensor, block: tuple[int, int], fmt: FP8Format = E4M3,
                       power_of_2_scales: bool = False, eps: float = 0.0):
    """Quantize with one fp32 scale per ``block``.

    Returns ``(data_u8 [M, N], scale_inv fp32 [ceil(M/b0), ceil(N/b1)])``.
    """
    b0, b1 = (int(b) for b in block)
    if b0 < 1 or b1 < 1:
        raise ValueError(f"block dims must be >= 1, got {block}")
    x = as_2d(x2d)
    amax = torch.clamp(block_amax(x, b0, b1), min=eps)  # clamp keeps NaN
    scale = fmt.max / amax
    ok = (amax > 0) & torch.isfinite(amax)
    scale = torch.clamp(torch.where(ok, scale, torch.ones_like(scale)), max=_F32_MAX)
    if power_of_2_scales:
        # Keep only the fp32 exponent bits: exact 2**floor(log2(scale)) for the
        # normal-range positive scales produced above.
        bits = scale.view(torch.int32) & 0x7F800000
        scale = bits.view(torch.float32)
    data = saturating_cast(x.to(torch.float32) * expand_blocks(scale, b0, b1, x.shape), fmt)
    return data, 1.0 / scale


def dequantize_blockwise(data_u8: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                         fmt: FP8Format = E4M3, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize_blockwise`: ``decode(q) * scale_inv_b``, shape ``[M, N]``."""
    b0, b1 = (int(b) for b in block)
    data = as_2d(data_u8)
    vals = data.view(fmt.torch_dtype).to(torch.float32)
    s = expand_blocks(scale_inv.to(torch.float32), b0, b1, data.shape)
    return (vals * s).to(dtype)
