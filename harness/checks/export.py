"""safetensors_export: the FP32 export of a trained model, checked against independent sources.

What users ship from a quantized training run is an FP32 ``safetensors`` file: for each
quantized parameter the optimizer's fp32 master weight when there is one, else the parameter as
fp32 (TE's test_safetensors_fp32_export exports the same way but checks only count and dtype;
a full-precision parameter's master is never exported: an optimizer may keep it stale). The
``export`` producer writes it right after training; this check reads the file back and compares
it with what it must equal, taken by other code paths:

``fp32_dtypes``  every exported tensor is fp32;
``vs_state``     bit for bit what *S* -- the state captured through ``get_state_dict`` for the
                 DCP checkpoint of the same trained model -- holds for it: a quantized
                 parameter's master weight, else the parameter (the file is the checkpoint's);
``vs_quantized`` the parameters the model computes with: each quantized weight (its dequantized
                 values, gathered apart from the export) must be a rounding of the exported
                 value to the recipe's weight format -- element by element within half a step
                 of the format's grid (plus the zero / subnormal region), not only in rel-L2 --
                 so an export that is not what the model trained into (a master drifted from
                 its weight, a stale copy, a wrong scale, a coarser format) fails.
Non-finite values fail every comparison (checks/compare.py).
"""

from __future__ import annotations

import math

import torch

from harness.calibration import tolerances
from harness.checks.base import Check
from harness.distributed.gather import held

# The weight format's rounding, element by element: (half a step of the element format
# relative to the value -- 2^-(m+1) for m mantissa bits: E4M3 2^-4, NVFP4's E2M1 2^-2 --;
# the zero / subnormal region relative to the largest |value| of the element's scaling block:
# E4M3 keeps normals down to 2^-6 of its largest 448, with room for a delayed scale 64x the
# current amax; E2M1's smallest step is 1/12 of a block's largest value; the block (rows,
# cols; None: the tensor) -- 16x16 covers TE's 2D NVFP4 weight blocks and the reference's
# 1x16, 1x32 the MXFP8 rowwise blocks the dequantized values come from). A weight at its
# block's largest magnitude may be saturated there. The rel-L2 guard of one rounding stays.
ROUNDING = {"delayed": (2.0**-4, 2.0**-13, None), "current": (2.0**-4, 2.0**-13, None),
            "block": (2.0**-4, 2.0**-13, (128, 128)), "mxfp8": (2.0**-4, 2.0**-13, (1, 32)),
            "nvfp4": (2.0**-2, 2.0**-4, (16, 16))}
WEIGHT_ROUNDING = {r: u for r, (u, _, _) in ROUNDING.items()} | {"nvfp4": 2.0**-2 + 2.0**-4}


def _expected(state: dict, name: str):
    """What S holds for an exported parameter: the parameter itself when it is a plain tensor
    there (full precision); for a quantized one the master weight, else its dequantized values
    (TE without master weights)."""
    for key in (f"model.{name}", f"optim.state.{name}.master_param", f"model.{name}#dequantized"):
        if isinstance(state.get(key), torch.Tensor):
            return state[key]
    return None


def _block_amax(x: torch.Tensor, block) -> torch.Tensor:
    """Each element's block's largest |value| (``block``: (rows, cols) of a 2-D view; None:
    the whole tensor's)."""
    a = x.abs()
    if block is None or a.dim() == 0:
        return a.max().expand(a.shape)
    a2 = a.reshape(a.shape[0], -1) if a.dim() > 1 else a.reshape(1, -1)
    (m, n), (r, c) = a2.shape, block
    padded = torch.nn.functional.pad(a2, (0, -n % c, 0, -m % r))
    blocks = padded.reshape(padded.shape[0] // r, r, padded.shape[1] // c, c).amax(dim=(1, 3))
    full = blocks.repeat_interleave(r, 0).repeat_interleave(c, 1)[:m, :n]
    return full.reshape(a.shape)


def beyond_rounding(exported: dict, quantized: dict, rounding) -> tuple[int, str]:
    """(number of elements, the first as text) of the model's quantized weights that are no
    rounding of the exported value: |exported - weight| > max(rel / (1 + rel) |exported| (the
    largest relative error of rounding to nearest with half-step ``rel``), ``floor`` x the
    largest |exported| of its block). A weight saturated at the largest magnitude its block
    holds (delayed scaling: an amax above its history's) is one."""
    rel, floor, block = rounding
    n, first = 0, ""
    for name in sorted(quantized):
        e, d = exported.get(name), quantized[name]
        if e is None or e.shape != d.shape or not e.numel():
            continue  # the comparison names it
        if not (held(e) and held(d)):
            continue  # a whole tensor rank 0 holds and checks (distributed/gather.py)
        e, d = e.detach().to(torch.float64), d.detach().to(torch.float64)
        err = (e - d).abs()
        bound = torch.maximum(rel / (1 + rel) * e.abs(), floor * _block_amax(e, block))
        saturated = (d.abs() == _block_amax(d, block)) & (e.abs() >= d.abs()) & (e * d >= 0)
        # slack 2^-16 (relative) for a value on a rounding midpoint: TE's fused FP8 Adam
        # kernel casts DelayedScaling weights in its own fp32 arithmetic, not from the stored
        # master weight, so an element on a midpoint may round the other way. A stale or
        # mis-scaled weight is >= 2^-8 off.
        over = (~(err <= bound * (1 + 2.0**-16)) & ~saturated).flatten()  # NaN: over
        k = int(over.sum())
        if k and not first:
            i = int(over.nonzero()[0])
            first = (f"{name}[flat {i}]: exported {e.flatten()[i].item():.9g}, the model "
                     f"computes with {d.flatten()[i].item():.9g} (bound "
                     f"{bound.flatten()[i].item():.3g})")
        n += k
    return n, first


def safetensors_export(art, rec) -> None:
    from safetensors.torch import load_file
    case, exported, saved = art.case, art["exported"], art["checkpoint"]
    loaded = load_file(str(exported.path))
    not_fp32 = sorted(n for n, t in loaded.items() if t.dtype != torch.float32)
    rec.flag("safetensors_export", "fp32_dtypes", not not_fp32,
             f"not fp32: {', '.join(not_fp32)}" if not_fp32 else f"{len(loaded)} fp32 tensors")
    expected = {n: _expected(saved.state, n) for n in loaded}
    missing = sorted(n for n, v in expected.items() if v is None)
    rec.compare("safetensors_export", "vs_state", {n: t for n, t in loaded.items()},
                {n: v.to(torch.float32) for n, v in expected.items() if v is not None},
                tolerances.BITWISE)
    if missing:
        rec.flag("safetensors_export", "in_state", False,
                 f"exported tensors with no master weight or parameter in S: {missing[:6]}")
    q = exported.quantized
    if q:
        rel, floor, block = rounding = ROUNDING.get(case.recipe, ROUNDING["current"])
        u = WEIGHT_ROUNDING.get(case.recipe, 2.0**-4)
        mine = {n: loaded[n] for n in q if n in loaded}
        n, first = beyond_rounding(mine, q, rounding)
        rec.compare("safetensors_export", "vs_quantized", mine, q, tolerances.Tolerance(
            math.inf, u, f"one rounding of {case.recipe} weights: every element within half a "
            f"step ({rel:g} relative; {floor:g} x the largest |value| of its "
            f"{'x'.join(map(str, block)) + ' block' if block else 'tensor'} near zero) and "
            f"rel-L2 <= {u:g}"),
            over=(n, f"{n} weights are no rounding of the exported value"
                     + (f", first: {first}" if first else "")))


CHECK = Check("safetensors_export", ("exported", "checkpoint"), safetensors_export)
