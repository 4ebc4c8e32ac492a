"""safetensors_export: the FP32 export of a trained model, with its values checked.

What users ship from a quantized training run is an FP32 ``safetensors`` file: for each
parameter the optimizer's fp32 master weight when there is one, else the parameter as fp32
(TE's test_safetensors_fp32_export exports the same way but checks only count and dtype). Here
the file must reload bit for bit, every tensor must be fp32, and every exported tensor must
equal the master weight (or parameter) it came from, bit for bit.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from .. import tolerances
from ..worker.run import full


def safetensors_export(run, rec) -> None:
    from safetensors.torch import load_file, save_file
    export, source = {}, {}
    for name, p in run.model.named_parameters():
        master = run.optim.state.get(p, {}).get("master_param")
        value = full(master) if master is not None else full(p)
        source[name] = value
        export[name] = value.to(torch.float32).contiguous()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.safetensors"
        save_file(export, str(path))  # every rank writes its own copy: no collective needed
        loaded = load_file(str(path))
    not_fp32 = sorted(n for n, t in loaded.items() if t.dtype != torch.float32)
    rec.flag("safetensors_export", "fp32_dtypes", not not_fp32,
             f"not fp32: {', '.join(not_fp32)}" if not_fp32 else f"{len(loaded)} fp32 tensors")
    rec.compare("safetensors_export", "reload", loaded, export, tolerances.BITWISE)
    rec.compare("safetensors_export", "values", export,
                {n: v.to(torch.float32) for n, v in source.items()}, tolerances.BITWISE)
