"""Adam with fp32 master weights for quantized parameters, like TE's FusedAdam
(``master_weights=True``).

For a QuantizedTensor parameter the optimizer keeps ``master_param`` (fp32), updates it, and
writes it back into the parameter by re-quantizing (``param.copy_(master)``, which reduces the
amax over the weight's shard group). Other parameters are updated in place. The update follows
``torch.optim.Adam`` (bias-corrected, ``addcdiv``), so the fp32 recipe matches the reference.

States (exp_avg, exp_avg_sq, master_param) are stored as DTensors with their parameter's mesh
and placements -- or, with fixes/optimizer_dtensor_state.py off, as plain local tensors.
"""

from __future__ import annotations

import math

import torch

from harness.reference.fixes import optimizer_dtensor_state as ods
from harness.reference.qtensor import QuantizedTensor


def _plain(t: torch.Tensor) -> torch.Tensor:
    t = ods.local(t)
    return t.dequantize() if isinstance(t, QuantizedTensor) else t


class MasterAdam(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-2, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = _plain(p.grad).to(torch.float32)
                local = ods.local(p)
                quantized = isinstance(local, QuantizedTensor)
                st = self.state[p]
                if not st:
                    st["step"] = torch.zeros((), dtype=torch.float32)
                    st["exp_avg"] = ods.wrap(torch.zeros_like(g), p)
                    st["exp_avg_sq"] = ods.wrap(torch.zeros_like(g), p)
                    if quantized:
                        st["master_param"] = ods.wrap(local.dequantize(dtype=torch.float32), p)
                st["step"] += 1
                step = float(st["step"])
                m, v = ods.local(st["exp_avg"]), ods.local(st["exp_avg_sq"])
                m.lerp_(g, 1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (v.sqrt() / math.sqrt(1 - b2 ** step)).add_(eps)
                target = ods.local(st["master_param"]) if quantized else local
                target.addcdiv_(m, denom, value=-lr / (1 - b1 ** step))
                if quantized:
                    local.copy_(target)  # re-quantize into the parameter's raw parts
        return None
