"""A training run on one rank: the backend's parallel model + optimizer on a mesh, and the
single-process FP32 reference it is compared with."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from ..mesh import MeshSpec
from . import data


LOCAL = "local."  # marks rank-local raw buffers: comparable only on the same mesh and rank


def mesh_independent(state: dict) -> dict:
    return {k: v for k, v in state.items() if f"#{LOCAL}" not in k}


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
        key = prefix[:-1]
        if hasattr(local, "full_parts"):  # reference: raw bytes + scales, gathered
            for k, v in local.full_parts(tree).items():
                out[f"{key}#{k}"] = v
            out[f"{key}#codec"] = local._codec.name
        elif _quantized(local):  # TE: values (gathered) + this rank's raw buffers
            out[f"{key}#dequantized"] = full(tree)
            for k, v in raw_buffers(local).items():
                out[f"{key}#{LOCAL}{k}"] = v
        else:
            out[key] = full(tree)
    else:
        out[prefix[:-1]] = tree
    return out


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (collective for DTensors); quantized -> dequantized."""
    if isinstance(t, DTensor):
        local = t._local_tensor
        return gather(t, local.dequantize() if _quantized(local) else local)
    if _quantized(t):
        t = t.dequantize()
    return t.detach().cpu().clone()


def gather(d: DTensor, local: torch.Tensor, shape=None) -> torch.Tensor:
    """Assemble a DTensor's global tensor (of ``shape``, default ``d.shape``) from every rank's
    ``local`` piece, placed at the offsets DTensor (and DCP) assign to it -- Shard,
    _StridedShard, Replicate alike. Object collectives over the default group (gloo on CPU):
    the harness's own gathers stay off the functional-collective path under test."""
    shape = tuple(d.shape if shape is None else shape)
    sizes, offsets = compute_local_shape_and_global_offset(shape, d.device_mesh, d.placements)
    piece = (tuple(offsets), tuple(sizes), local.detach().cpu())
    pieces = [None] * dist.get_world_size()
    dist.all_gather_object(pieces, piece)
    out = torch.zeros(shape, dtype=local.dtype)
    for offs, szs, loc in pieces:
        out[tuple(slice(o, o + n) for o, n in zip(offs, szs))] = loc.reshape(szs)
    return out


def _quantized(t) -> bool:
    """A quantized tensor subclass (the reference's or TransformerEngine's)."""
    return type(t) is not torch.Tensor and hasattr(t, "dequantize") and \
        (hasattr(t, "full_parts") or hasattr(t, "get_metadata"))


RAW_EXCLUDE = ("transpose", "columnwise")  # TE rebuilds these lazily; not part of the saved bytes


def raw_buffers(t) -> dict:
    """A TransformerEngine quantized tensor's own raw buffers (rowwise data, scales, amax)."""
    out = {}
    for k, v in t.get_metadata().items():
        if isinstance(v, torch.Tensor) and not any(x in k for x in RAW_EXCLUDE):
            out[k.lstrip("_")] = v.detach().cpu().clone()
    return out


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


def reference_run(case, backend, steps: int, device, lr_scale: float = 1.0):
    """Single-process FP32 run on the whole global batch: losses per step, first-step grads,
    final params (canonical names)."""
    model = backend.reference_model(case, case.train.seed, device)
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
