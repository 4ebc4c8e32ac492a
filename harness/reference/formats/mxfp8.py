"""MXFP8 reference (OCP Microscaling Formats spec v1.0).

An MX block is ``BLOCK = 32`` consecutive elements sharing one scale ``X``
stored as **E8M0**: an 8-bit biased exponent with no sign and no mantissa,
``X = 2**(code - 127)`` for ``code`` in 0..254 and ``code == 255`` = NaN.
Elements are FP8 (E4M3 by default, E5M2 allowed). Dequantization is
``x = X * decode(q)``.

Shared scale (OCP spec section 6.3, ``scale_rounding="floor"``, the default)::

    X = 2**(floor(log2(amax)) - emax_elem)      emax_elem = 8 (E4M3), 15 (E5M2)
    q = saturating_cast(x / X)

so the block's largest element lands in ``[2**emax_elem, 2**(emax_elem+1))``
and values above ``fmt.max`` (e.g. 448..512 for E4M3) saturate.

``scale_rounding="ceil"`` instead picks the smallest power of two with
``amax / X <= fmt.max``, i.e. ``X = 2**ceil(log2(amax / fmt.max))``; no element
saturates. TE's documentation describes its MXFP8 scale as
``float_to_e8m0(amax / max_norm)`` rounded up, which is this mode; use it when
comparing bytes against TE (not verified against TE kernels here).

Conventions chosen here:

* Exponent codes are clamped to ``[0, 254]``; an all-zero block gets code 0
  (``X = 2**-127``) and all-zero elements.
* A block containing NaN gets scale code 255 (NaN), and its elements NaN, so
  it dequantizes to NaN. ±inf (without NaN) counts as exponent 128 in floor
  mode (then clamped) and saturates to ±fmt.max as an element.
* Layout: ``axis=-1`` ("rowwise"): blocks along the last dim, scale shape
  ``[M, ceil(N/32)]``; ``axis=0`` ("columnwise"): blocks along dim 0, scale
  shape ``[ceil(M/32), N]``. Data keeps the input's ``[M, N]`` layout in both
  cases. Partial blocks at the edge are allowed. Non-2-D inputs are viewed as
  ``(prod(shape[:-1]), shape[-1])``.
"""

from __future__ import annotations

import torch

from harness.reference.formats.block import as_2d, block_amax, expand_blocks
from harness.reference.formats.fp8 import E4M3, FP8Format, saturating_cast

__all__ = ["BLOCK", "EMAX_ELEM", "e8m0_to_float", "float_to_e8m0", "quantize_mxfp8",
           "dequantize_mxfp8"]

BLOCK = 32
EMAX_ELEM = {"e4m3": 8, "e5m2": 15}  # exponent of the largest normal element power of two


def _block_dims(axis: int) -> tuple[int, int]:
    if axis in (-1, 1):
        return 1, BLOCK
    if axis in (0, -2):
        return BLOCK, 1
    raise ValueError(f"axis must be -1 (rowwise) or 0 (columnwise), got {axis}")


def e8m0_to_float(code_u8: torch.Tensor) -> torch.Tensor:
    """Decode E8M0 codes to fp32: ``2**(code - 127)``; 0 -> 2**-127 (fp32 subnormal), 255 -> NaN."""
    c = code_u8.to(torch.int32)
    bits = torch.where(c == 0, torch.full_like(c, 0x00400000), c << 23)
    bits = torch.where(c == 255, torch.full_like(c, 0x7FC00000), bits)
    return bits.view(torch.float32)


def float_to_e8m0(pow2_fp32: torch.Tensor) -> torch.Tensor:
    """Encode positive powers of two as E8M0 codes (uint8).

    Exact for ``2**-127 .. 2**127``. Other inputs: non-powers of two are rounded
    down to a power of two (the fp32 exponent field is kept), zero and values
    below ``2**-126`` map to 0, inf/NaN map to 255 (NaN).
    """
    bits = pow2_fp32.to(torch.float32).view(torch.int32)
    return ((bits >> 23) & 0xFF).to(torch.uint8)


def _scale_codes(amax: torch.Tensor, fmt: FP8Format, scale_rounding: str) -> torch.Tensor:
    """Per-block E8M0 codes (int32) from fp32 block amax."""
    if scale_rounding == "floor":
        # floor(log2(amax)) from the fp32 exponent field; zero/subnormal amax
        # reads as -127 which clamps to code 0 like its true exponent would.
        e = ((amax.view(torch.int32) >> 23) & 0xFF) - 127
        code = e - EMAX_ELEM[fmt.name] + 127
    elif scale_rounding == "ceil":
        v = (amax / fmt.max).view(torch.int32)
        code = ((v >> 23) & 0xFF) + ((v & 0x7FFFFF) != 0).to(torch.int32)
    else:
        raise ValueError(f"scale_rounding must be 'floor' or 'ceil', got {scale_rounding!r}")
    code = torch.clamp(code, 0, 254)
    return torch.where(torch.isnan(amax), torch.full_like(code, 255), code)


def quantize_mxfp8(x2d: torch.Tensor, axis: int = -1, fmt: FP8Format = E4M3,
                   scale_rounding: str = "floor"):
    """Quantize to MXFP8. Returns ``(data_u8 [M, N], scale_e8m0 uint8)`` (shapes above)."""
    b0, b1 = _block_dims(axis)
    x = as_2d(x2d).to(torch.float32)
    code = _scale_codes(block_amax(x, b0, b1), fmt, scale_rounding)
    X = e8m0_to_float(code)
    data = saturating_cast(x / expand_blocks(X, b0, b1, x.shape), fmt)
    return data, code.to(torch.uint8)


def dequantize_mxfp8(data_u8: torch.Tensor, scale_e8m0: torch.Tensor, axis: int = -1,
                     fmt: FP8Format = E4M3, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``decode(q) * X`` per block (fp32 math), shape ``[M, N]``, returned as ``dtype``."""
    b0, b1 = _block_dims(axis)
    data = as_2d(data_u8)
    vals = data.view(fmt.torch_dtype).to(torch.float32)
    X = expand_blocks(e8m0_to_float(scale_e8m0), b0, b1, data.shape)
    return (vals * X).to(dtype)
