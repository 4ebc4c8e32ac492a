"""NVFP4 reference: E2M1 elements, 16-element blocks with E4M3 scales, fp32 global scale.

**E2M1** (4 bits: 1 sign, 2 exponent, 1 mantissa) represents
``0, 0.5, 1, 1.5, 2, 3, 4, 6`` (codes 0..7) and their negatives (codes 8..15,
sign bit 0x8; code 8 is -0). No inf/NaN. Two codes are packed per byte:
element ``2i`` in the LOW nibble, element ``2i+1`` in the HIGH nibble.

**Two-level scaling.** With ``global_amax`` the amax of the whole (unsharded)
tensor::

    S_enc   = (448 * 6) / global_amax          (global_amax == 0 or non-finite -> 1.0)
    s_b     = e4m3_saturating_cast(block_amax / 6 * S_enc)      # stored per block
    q       = encode_e2m1(x * S_enc / decode(s_b))               # decode(s_b) == 0 -> 0
    x      ~= decode_e2m1(q) * decode(s_b) / S_enc

``S_enc`` maps the global amax onto the largest block scale (448) times the
largest element (6), so every block scale fits E4M3. Because ``S_enc`` depends
on the *global* amax, shards of a tensor must quantize with a group-reduced
amax to match quantizing the full tensor.

Encoding (torch has no float4 cast on CPU) is done with comparison
thresholds: round-to-nearest, ties to the even code (mantissa bit 0, as in
IEEE round-half-even), i.e. the midpoints map to values 0.25 -> 0, 0.75 -> 1,
1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4. Magnitudes above 6 (and ±inf) saturate to ±6. The sign bit of the
input is kept, so negative values rounding to zero give -0 (code 8). NaN has
no E2M1 encoding and is encoded as +6 (code 7); a NaN in a block also makes the
block scale NaN, so the block dequantizes to NaN anyway.

Layout: ``axis=-1`` (rowwise): blocks of 16 and packing along the last dim:
packed ``[M, N/2]``, block scales ``[M, ceil(N/16)]``. ``axis=0``
(columnwise): blocks of 16 and packing along dim 0: packed ``[M/2, N]`` with
rows ``2i`` / ``2i+1`` in the low / high nibble, block scales
``[ceil(M/16), N]``. The packed dim must be even; the blocked dim may end in
a partial block. Non-2-D inputs are viewed as ``(prod(shape[:-1]), shape[-1])``.
"""

from __future__ import annotations

from typing import Optional

import torch

from harness.reference.formats.block import as_2d, block_amax, expand_blocks
from harness.reference.formats.fp8 import E4M3, saturating_cast
from harness.reference.formats.fp8 import amax as tensor_amax

__all__ = ["BLOCK", "E2M1_VALUES", "E2M1_MAX", "encode_e2m1", "decode_e2m1", "pack_fp4",
           "unpack_fp4", "global_scale", "quantize_nvfp4", "dequantize_nvfp4"]

BLOCK = 16
E2M1_MAX = 6.0
_MAGNITUDES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
E2M1_VALUES = torch.tensor(_MAGNITUDES + [-v for v in _MAGNITUDES], dtype=torch.float32)

# Midpoints between consecutive magnitudes. A tie rounds toward the even code:
# midpoint k (between codes k and k+1) rounds down when k is even, up when k is odd.
_MIDPOINTS = [(a + b) / 2 for a, b in zip(_MAGNITUDES, _MAGNITUDES[1:])]
_F32_MAX = torch.finfo(torch.float32).max


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round to E2M1 codes 0..15 (uint8): nearest, ties to even code, saturating at ±6."""
    a = x.to(torch.float32).abs()
    mag = torch.zeros(a.shape, dtype=torch.int32, device=a.device)
    for k, t in enumerate(_MIDPOINTS):
        mag += (a > t if k % 2 == 0 else a >= t).to(torch.int32)
    mag = torch.where(torch.isnan(a), torch.full_like(mag, 7), mag)
    sign = torch.signbit(x.to(torch.float32)) & ~torch.isnan(a)
    return (mag + 8 * sign.to(torch.int32)).to(torch.uint8)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (low 4 bits used) -> fp32 values."""
    return E2M1_VALUES.to(codes.device)[(codes & 0xF).long()]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes along the last dim: ``[..., N] -> [..., N/2]`` (2i low, 2i+1 high)."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4 needs an even last dim, got shape {tuple(codes.shape)}")
    c = codes.to(torch.uint8) & 0xF
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_fp4`: ``[..., K] uint8 -> [..., 2K]`` codes 0..15."""
    lo, hi = packed & 0xF, packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def global_scale(global_amax: torch.Tensor) -> torch.Tensor:
    """fp32 ``S_enc = 448 * 6 / global_amax``; 0 or non-finite amax -> 1.0; clamped finite."""
    g = torch.as_tensor(global_amax, dtype=torch.float32)
    s = (E4M3.max * E2M1_MAX) / g
    s = torch.where((g > 0) & torch.isfinite(g), s, torch.ones_like(s))
    return torch.clamp(s, max=_F32_MAX)


def _check_axis(axis: int) -> bool:
    if axis in (-1, 1):
        return False
    if axis in (0, -2):
        return True
    raise ValueError(f"axis must be -1 (rowwise) or 0 (columnwise), got {axis}")


def quantize_nvfp4(x2d: torch.Tensor, global_amax: Optional[torch.Tensor] = None, axis: int = -1):
    """Quantize to NVFP4. Returns ``(packed uint8, block_scale_e4m3 uint8, s_enc fp32 scalar)``.

    ``global_amax`` defaults to ``amax(x)``; pass the group-reduced amax when
    ``x`` is a shard of a larger tensor. Shapes: see the module docstring.
    """
    columnwise = _check_axis(axis)
    x = as_2d(x2d).to(torch.float32)
    if columnwise:
        x = x.t()  # quantize rows of x^T, transpose results back
    if x.shape[-1] % 2:
        dim = 0 if columnwise else -1
        raise ValueError(f"NVFP4 packs 2 values per byte along dim {dim}; its size "
                         f"{x.shape[-1]} must be even (input shape {tuple(x2d.shape)})")
    g = tensor_amax(x) if global_amax is None else global_amax
    s_enc = global_scale(torch.as_tensor(g, dtype=torch.float32, device=x.device)).reshape(())

    bamax = block_amax(x, 1, BLOCK)
    scale_u8 = saturating_cast(bamax / E2M1_MAX * s_enc, E4M3)
    dec = expand_blocks(scale_u8.view(torch.float8_e4m3fn).to(torch.float32), 1, BLOCK, x.shape)
    scaled = torch.where(dec > 0, x * s_enc / dec, x * 0.0)
    packed = pack_fp4(encode_e2m1(scaled))
    if columnwise:
        packed, scale_u8 = packed.t().contiguous(), scale_u8.t().contiguous()
    return packed, scale_u8, s_enc


def dequantize_nvfp4(packed: torch.Tensor, block_scale_u8: torch.Tensor, s_enc: torch.Tensor,
                     shape, axis: int = -1, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``decode_e2m1(q) * decode_e4m3(s_b) / S_enc`` reshaped to ``shape`` (original shape)."""
    columnwise = _check_axis(axis)
    if columnwise:
        packed, block_scale_u8 = packed.t(), block_scale_u8.t()
    vals = decode_e2m1(unpack_fp4(packed))
    dec = block_scale_u8.contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    s_enc = torch.as_tensor(s_enc, dtype=torch.float32, device=vals.device)
    out = vals * expand_blocks(dec, 1, BLOCK, vals.shape) / s_enc
    if columnwise:
        out = out.t()
    return out.reshape(shape).to(dtype)
