"""A training run on one rank: the backend's parallel model + optimizer on a mesh, and the
single-process FP32 reference it is compared with."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.tensor import DTensor

from ..mesh import MeshSpec
from . import data, modules


def flatten(tree, prefix: str = "") -> dict:
    """{"model": {"fc1.weight": t}, "optim": {"state": {...}}} -> {"model.fc1.weight": t, ...};
    tensors are detached CPU copies, other leaves kept as they are."""
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(flatten(v, f"{prefix}{i}."))
    elif isinstance(tree, torch.Tensor):
        local = tree._local_tensor if isinstance(tree, DTensor) else tree
        if hasattr(local, "full_parts"):  # quantized: compare raw bytes + scales, not values
            for k, v in local.full_parts(tree).items():
                out[f"{prefix[:-1]}#{k}"] = v
            out[f"{prefix[:-1]}#codec"] = local._codec.name
        else:
            out[prefix[:-1]] = full(tree)
    else:
        out[prefix[:-1]] = tree
    return out


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (collective for DTensors); quantized -> dequantized."""
    if isinstance(t, DTensor):
        local = t._local_tensor
        if hasattr(local, "full_parts"):
            t = DTensor.from_local(local.dequantize(), t.device_mesh, t.placements, shape=t.shape,
                                   stride=t.stride(), run_check=False)
        t = t.full_tensor()
    elif hasattr(t, "full_parts"):
        t = t.dequantize()
    return t.detach().cpu().clone()


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.float(), y.float())


class Run:
    """Model + optimizer on ``mesh_spec``; all methods are collective over the world."""

    def __init__(self, ctx, case, mesh_spec: MeshSpec, seed: int):
        self.ctx, self.case, self.spec = ctx, case, mesh_spec
        self.mesh = ctx.mesh(mesh_spec)
        self.backend = ctx.backend
        self.model = self.backend.build(case, self.mesh, mesh_spec, seed, ctx.device)
        self.optim = self.backend.optimizer(self.model, case)

    def step(self, step: int, capture_grads: bool = False):
        """One training step on this rank's slice of global batch ``step``.
        Returns (global mean loss, full grads or None)."""
        c = self.case
        x, y = data.local_batch(c.ax["module"], c.model, c.train.seed, step, self.spec,
                                self.ctx.rank, self.ctx.device)
        with self.backend.autocast(c):
            out = self.model(x)
        loss = mse(out, y)
        loss.backward()
        grads = self._canonical({n: full(p.grad) for n, p in self.model.named_parameters()}) \
            if capture_grads else None
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)
        total = loss.detach().clone()
        dist.all_reduce(total)  # TP ranks hold equal copies of their dp slice's loss
        return float(total) / self.ctx.world_size, grads

    def full_params(self) -> dict[str, torch.Tensor]:
        """Parameter values (dequantized), under the canonical (plain-torch module) names."""
        return self._canonical({n: full(p) for n, p in self.model.named_parameters()})

    def _canonical(self, d: dict) -> dict:
        names = self.backend.canonical_names(self.model)
        return {names.get(k, k): v for k, v in d.items()}

    def full_state(self) -> dict:
        """Model + optimizer state as full (unsharded) CPU tensors, flattened; quantized
        tensors as their raw parts. Plain (non-DTensor) tensors stay as this rank holds them."""
        msd, osd = get_state_dict(self.model, self.optim)
        return flatten({"model": msd, "optim": osd})


def reference_run(case, steps: int, device, lr_scale: float = 1.0):
    """Single-process FP32 run on the whole global batch: losses per step, first-step grads,
    final params (canonical names)."""
    model = modules.build(case.ax["module"], case.model, case.train.seed, device)
    optim = torch.optim.Adam(model.parameters(), lr=case.train.lr * lr_scale)
    losses, grads = [], None
    for step in range(steps):
        x, y = data.local_batch(case.ax["module"], case.model, case.train.seed, step, None, 0, device)
        loss = mse(model(x), y)
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}
        optim.step()
        optim.zero_grad(set_to_none=True)
        losses.append(loss.item())
    params = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    return losses, grads, params
