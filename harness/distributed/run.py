"""A training run on one rank: the backend's parallel model + optimizer on a mesh, and the
single-process FP32 reference it is compared with."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.tensor import DTensor

from harness.distributed import data
from harness.distributed.gather import Gather
from harness.spec.mesh import MeshSpec

LOCAL = "local."  # marks rank-local raw buffers: comparable only on the same mesh and rank


def mesh_independent(state: dict) -> dict:
    return {k: v for k, v in state.items() if f"#{LOCAL}" not in k}


def _leaves(tree, prefix: str = ""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _leaves(v, f"{prefix}{i}.")
    else:
        yield prefix[:-1], tree


def flatten(tree, raw: bool = True) -> dict:
    """{"model": {"fc1.weight": t}, "optim": {"state": {...}}} -> {"model.fc1.weight": t, ...}
    with whole CPU tensors (DTensors gathered to rank 0, placeholders elsewhere: one
    collective for the whole tree) and other leaves as they are. ``raw``: quantized tensors as
    their raw parts -- the reference's gathered to full size, TE's as this rank's buffers
    (``#local.``) plus the values -- else as dequantized values."""
    out, g = {}, Gather()
    for key, v in _leaves(tree):
        if not isinstance(v, torch.Tensor):
            out[key] = v
            continue
        local = v._local_tensor if isinstance(v, DTensor) else v
        if raw and hasattr(local, "full_parts"):  # reference: raw bytes + scales
            if isinstance(v, DTensor):
                local.add_parts(g, key, v)
            else:
                out.update({f"{key}#{k}": p for k, p in local.full_parts(v).items()})
            out[f"{key}#codec"] = local._codec.name
            continue
        if raw and is_quantized(local):  # TE: values + this rank's raw buffers
            for k, b in raw_buffers(local).items():
                out[f"{key}#{LOCAL}{k}"] = b
            key = f"{key}#dequantized"
        values = local.dequantize() if is_quantized(local) else local
        if isinstance(v, DTensor):
            g.add(key, v, values)
        else:
            out[key] = values.detach().cpu().clone()
    out.update(g.run())
    return out


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor (collective for DTensors: on rank 0, a placeholder elsewhere --
    distributed/gather.py); quantized -> dequantized."""
    return flatten({"t": t}, raw=False)["t"]


def is_quantized(t) -> bool:
    """A quantized tensor subclass (the reference's or TransformerEngine's)."""
    return type(t) is not torch.Tensor and hasattr(t, "dequantize") and \
        (hasattr(t, "full_parts") or hasattr(t, "get_metadata"))


def raw_buffers(t) -> dict:
    """Every raw buffer a TransformerEngine quantized tensor carries (rowwise and columnwise
    data, transpose caches, scales, amax): ``get_metadata()``'s tensors. A buffer TE builds
    lazily is absent (None) until built; ``backend.lazy_buffers`` names those the checks may
    compare after the next step instead (checks/roundtrip.py)."""
    out = {}
    stale = bool(getattr(t, "_transpose_invalid", False))  # TE marks a stale transpose cache
    for k, v in t.get_metadata().items():
        if isinstance(v, torch.Tensor) and not (stale and "transpose" in k):
            out[k.lstrip("_")] = v.detach().cpu().clone()
    return out


class Run:
    """Model + optimizer on ``mesh_spec``; all methods are collective over the world."""

    def __init__(self, ctx, case, mesh_spec: MeshSpec, seed: int):
        self.ctx, self.case, self.spec = ctx, case, mesh_spec
        self.backend = ctx.backend
        self.mesh = ctx.mesh(mesh_spec, self.backend.mesh_names(case))
        self.model = self.backend.build(case, self.mesh, mesh_spec, seed, ctx.device)
        self.optim = self.backend.optimizer(self.model, case)
        self.after_backward: list = []  # f(model) after each backward, before grads are read

    def step(self, step: int, capture_grads: bool = False):
        """One training step on this rank's slice of global batch ``step``.
        Returns (global mean loss, full grads or None)."""
        c = self.case
        x, y = data.local_batch(c.task, c.model, c.train.seed, step, self.spec,
                                self.ctx.rank, self.ctx.device)
        with self.backend.autocast(c):
            out = self.model(x)
        loss = data.TASKS[c.task].loss(out, y)
        loss.backward()
        for hook in self.after_backward:
            hook(self.model)
        grads = self._canonical(flatten({n: p.grad for n, p in self.model.named_parameters()},
                                        raw=False)) if capture_grads else None
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)
        return self._global_loss(loss), grads

    def _global_loss(self, loss) -> float:
        """The mean over the data-parallel slices of their local mean losses, summed in slice
        order in fp32 (``slices_mean``, as the sharding-invariance twin sums them). Every
        rank's loss is gathered: the TP ranks of a slice hold equal copies (their mean where
        they do not)."""
        mine = loss.detach().to(torch.float32).reshape(1)
        every = torch.empty(self.ctx.world_size, dtype=torch.float32, device=mine.device)
        dist.all_gather_into_tensor(every, mine)
        by_slice: dict[int, list] = {}
        for r, v in enumerate(every.cpu()):
            by_slice.setdefault(self.spec.dp_index(r), []).append(v)
        return slices_mean([c[0] if all(bool(x == c[0]) for x in c) else torch.stack(c).mean()
                            for _, c in sorted(by_slice.items())])

    @property
    def quantized(self) -> bool:
        return any(is_quantized(getattr(p, "_local_tensor", p)) for p in self.model.parameters())

    def full_params(self, masters: bool = True) -> dict[str, torch.Tensor]:
        """Parameter values under the canonical (plain-torch module) names: for a quantized
        parameter the optimizer's fp32 master weight where it keeps one (``masters``), else the
        parameter (quantized: dequantized)."""
        return self._canonical(flatten({n: self.truth(p) if masters else p
                                        for n, p in self.model.named_parameters()}, raw=False))

    def truth(self, p):
        """What parameter ``p`` holds: the optimizer's fp32 master weight for a quantized one
        (the quantized weight is a rounding of it), else ``p`` itself -- an optimizer may keep an
        unused (stale) master_param for a full-precision one (TE FusedAdam does)."""
        if not is_quantized(getattr(p, "_local_tensor", p)):
            return p
        master = self.optim.state.get(p, {}).get("master_param")
        return master if isinstance(master, torch.Tensor) else p

    def _canonical(self, d: dict) -> dict:
        names = self.backend.canonical_names(self.model)
        return {names.get(k, k): v for k, v in d.items()}

    def full_state(self) -> dict:
        """Model + optimizer state as full (unsharded) CPU tensors, flattened; quantized
        tensors as their raw parts. Plain (non-DTensor) tensors stay as this rank holds them."""
        msd, osd = get_state_dict(self.model, self.optim)
        return self.backend.canonical_state(flatten({"model": msd, "optim": osd}))


def slices_mean(values) -> float:
    """The mean of the data-parallel slices' losses (fp32 scalars, in slice order): summed in
    fp32 from zero in that order, the sum divided in Python -- one arithmetic for the sharded
    run and its twin, so that their losses agree bit for bit where the slices' do."""
    total = torch.zeros((), dtype=torch.float32)
    for v in values:
        total += v
    return float(total) / len(values)


def reference_run(case, backend, steps: int, device, lr_scale: float = 1.0):
    """Single-process FP32 run on the whole global batch: losses per step, first-step grads,
    initial and final params (canonical names)."""
    model = backend.reference_model(case, case.train.seed, device)
    initial = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    optim = torch.optim.Adam(model.parameters(), lr=case.train.lr * lr_scale)
    losses, grads = [], None
    for step in range(steps):
        x, y = data.local_batch(case.task, case.model, case.train.seed, step, None, 0, device)
        loss = data.TASKS[case.task].loss(model(x), y)
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}
        optim.step()
        optim.zero_grad(set_to_none=True)
        losses.append(loss.item())
    params = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    return losses, grads, initial, params
