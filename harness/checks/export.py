"""safetensors_export: the FP32 export of a trained model, checked against independent sources.

What users ship from a quantized training run is an FP32 ``safetensors`` file: for each
parameter the optimizer's fp32 master weight when there is one, else the parameter as fp32
(TE's test_safetensors_fp32_export exports the same way but checks only count and dtype). The
``export`` producer writes it right after training; this check reads the file back and compares
it with what it must equal, taken by other code paths:

``fp32_dtypes``  every exported tensor is fp32;
``vs_state``     bit for bit the master weight (or parameter) in *S*, the state captured through
                 ``get_state_dict`` for the DCP checkpoint of the same trained model;
``vs_quantized`` for quantized parameters, within one rounding of the recipe's weight format of
                 the quantized weight the model computes with (its dequantized values).
Non-finite values fail every comparison (checks/compare.py).
"""

from __future__ import annotations

import math

import torch

from harness.calibration import tolerances
from harness.checks.base import Check

# relative rounding of one quantization of a weight (unit roundoff of the element format; NVFP4
# adds the rounding of its E4M3 block scale)
WEIGHT_ROUNDING = {"delayed": 2.0**-4, "current": 2.0**-4, "block": 2.0**-4, "mxfp8": 2.0**-4,
                   "nvfp4": 2.0**-2 + 2.0**-4}


def _expected(state: dict, name: str):
    """The master weight in S, else the parameter: plain, or a TE quantized one's dequantized
    values (the reference backend's quantized parameters always have masters)."""
    for key in (f"optim.state.{name}.master_param", f"model.{name}", f"model.{name}#dequantized"):
        if isinstance(state.get(key), torch.Tensor):
            return state[key]
    return None


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
        u = WEIGHT_ROUNDING.get(case.recipe, 2.0**-4)
        rec.compare("safetensors_export", "vs_quantized", {n: loaded[n] for n in q if n in loaded},
                    q, tolerances.Tolerance(math.inf, u, (
                        f"one rounding of {case.recipe} weights: relative error at most the "
                        f"format's unit roundoff {u:g} per element, so rel-L2 <= {u:g}")))


CHECK = Check("safetensors_export", ("exported", "checkpoint"), safetensors_export)
