"""A training run on one rank: the backend's parallel model + optimizer on a mesh, and the
single-process FP32 reference it is compared with."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.tensor import DTensor

from ..mesh import MeshSpec
from . import data, modules
from .parallel import device_mesh


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
        t = tree.full_tensor() if isinstance(tree, DTensor) else tree
        out[prefix[:-1]] = t.detach().cpu().clone()
    else:
        out[prefix[:-1]] = tree
    return out


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.float(), y.float())


class Run:
    """Model + optimizer on ``mesh_spec``; all methods are collective over the world."""

    def __init__(self, ctx, case, mesh_spec: MeshSpec, seed: int):
        self.ctx, self.case, self.spec = ctx, case, mesh_spec
        self.mesh = device_mesh(mesh_spec, ctx.device_type)
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
        grads = {n: full(p.grad) for n, p in self.model.named_parameters()} if capture_grads else None
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)
        total = loss.detach().clone()
        dist.all_reduce(total)  # TP ranks hold equal copies of their dp slice's loss
        return float(total) / self.ctx.world_size, grads

    def full_params(self) -> dict[str, torch.Tensor]:
        return {n: full(p) for n, p in self.model.named_parameters()}

    def full_state(self) -> dict:
        """Model + optimizer state as full (unsharded) CPU tensors, flattened."""
        msd, osd = get_state_dict(self.model, self.optim,
                                  options=StateDictOptions(full_state_dict=True))
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
