"""Recipes: how weights are stored (QuantizedTensor, codecs.py) and how GEMM operands are
quantized (emulated: quantize -> dequantize, then an fp32 matmul).

    recipe   weights (primary, quantized_model_init)   activations / grads
    delayed  fp8 E4M3, scale from an amax history      E4M3 / E5M2, amax history
    current  fp8 E4M3, scale from the current amax     E4M3 / E5M2, current amax (local)
    block    FP8 128x128 blocks, power-of-2 scales     1x128 blocks (along the contraction)
    mxfp8    MXFP8 1x32 rowwise + 32x1 columnwise      1x32 blocks along the contraction
    nvfp4    NVFP4 1x16 rowwise + 16x1 columnwise      NVFP4 1x16 along the contraction

Amaxes that define one scale for a whole *sharded* weight (current, nvfp4, and delayed
histories) are all-reduced (MAX) over the weight's shard group; for current and nvfp4 that
group is what fixes/amax_reduction_group.py switches. Delayed-scaling histories live in module
buffers (``QuantState``) so DCP checkpoints them and a resumed run quantizes identically.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from harness.reference import codecs
from harness.reference.fixes import amax_reduction_group
from harness.reference.formats import block as blockfmt
from harness.reference.formats import fp8, mxfp8, nvfp4
from harness.reference.qtensor import make

WEIGHT_CODEC = {"delayed": codecs.FP8, "current": codecs.FP8, "block": codecs.BLOCK,
                "mxfp8": codecs.MXFP8, "nvfp4": codecs.NVFP4}
HISTORY = 16


def _allreduce_max(t: torch.Tensor, group) -> torch.Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t


class OneUpdatePerStep:
    """While active, DelayedScaling's history updates of every GEMM are held back and made at
    the end as the sharded run makes them: once per call of the step, from the max over the
    data-parallel slices the one-rank twin runs as micro-batches (the sharded run takes that
    max with an all-reduce) -- ``next_slice()`` between slices, ``flush()`` once at the end."""

    active: "OneUpdatePerStep | None" = None

    def __init__(self):
        self.pending: dict = {}  # (id(state), role) -> [state, role, fmt, [amax per call]]
        self.calls: dict = {}  # (id(state), role) -> calls seen in this slice

    def __enter__(self):
        OneUpdatePerStep.active = self
        return self

    def __exit__(self, *exc):
        OneUpdatePerStep.active = None
        if exc[0] is None:
            self.flush()

    def next_slice(self) -> None:
        self.calls = {}

    def add(self, state, role, amax, fmt) -> None:
        k = (id(state), role)
        i = self.calls.get(k, 0)
        self.calls[k] = i + 1
        amaxes = self.pending.setdefault(k, [state, role, fmt, []])[3]
        if i < len(amaxes):
            amaxes[i] = torch.maximum(amaxes[i], amax)
        else:
            amaxes.append(amax.clone())

    @torch.no_grad()
    def flush(self) -> None:
        for state, role, fmt, amaxes in self.pending.values():
            for amax in amaxes:
                state.record(role, amax, fmt)
        self.pending = {}


class QuantState(nn.Module):
    """Delayed-scaling amax histories and scales of one GEMM (buffers: checkpointed)."""

    ROLES = ("weight", "input", "grad")

    def __init__(self):
        super().__init__()
        for role in self.ROLES:
            self.register_buffer(f"{role}_amax_history", torch.zeros(HISTORY))
            self.register_buffer(f"{role}_scale", torch.ones(()))

    @torch.no_grad()
    def reset(self) -> None:
        for role in self.ROLES:
            getattr(self, f"{role}_amax_history").zero_()
            self.scale(role).fill_(1.0)

    def scale(self, role: str) -> torch.Tensor:
        return getattr(self, f"{role}_scale")

    @torch.no_grad()
    def record(self, role: str, amax: torch.Tensor, fmt: fp8.FP8Format) -> None:
        """Roll the history (newest first) and set the next scale from its max (TE's
        DelayedScaling(amax_history_len=16, amax_compute_algo="max")); held back while a
        ``OneUpdatePerStep`` is active."""
        if OneUpdatePerStep.active is not None:
            OneUpdatePerStep.active.add(self, role, amax, fmt)
            return
        hist = getattr(self, f"{role}_amax_history")
        hist.copy_(torch.roll(hist, 1))
        hist[0] = amax.to(hist.dtype)
        self.scale(role).copy_(fp8.scale_from_amax(hist.amax(), fmt))


class WeightQuantizer:
    """Quantizes a weight (or a shard of it) into a QuantizedTensor for ``recipe``."""

    def __init__(self, recipe: str, weight_group=None, state: QuantState | None = None,
                 dtype=torch.float32):
        self.recipe = recipe
        self.codec = WEIGHT_CODEC[recipe]
        self.weight_group = weight_group  # every rank holding a piece of this weight
        self.state = state
        self.dtype = dtype
        self.usages = {"row", "col"}

    def __deepcopy__(self, memo):  # shared config; DCP staging deep-copies tensor __dict__s
        return self

    def _q(self, x2d: torch.Tensor) -> dict:
        local_amax = fp8.amax(x2d)
        if self.recipe == "current":
            amax = _allreduce_max(local_amax, amax_reduction_group.group(self.weight_group))
            return {"scale": fp8.scale_from_amax(amax, fp8.E4M3)}
        if self.recipe == "delayed":
            scale = self.state.scale("weight").clone()
            self.state.record("weight", _allreduce_max(local_amax, self.weight_group), fp8.E4M3)
            return {"scale": scale}
        if self.recipe == "nvfp4":
            return {"global_amax": _allreduce_max(local_amax, amax_reduction_group.group(self.weight_group))}
        return {}

    def parts(self, x: torch.Tensor, usages=None) -> dict:
        x2d = x.detach().reshape(x.shape[0], -1).to(torch.float32)
        return self.codec.quantize(x2d, usages or self.usages, self._q(x2d))

    def empty(self, shape, device):
        """A QuantizedTensor with allocated, uninitialized parts (e.g. on the meta device)."""
        parts = {k: torch.zeros(self.codec.part_shape(k, shape), dtype=self.codec.dtypes[k],
                                device=device) for k in self.codec.parts_for(self.usages)}
        return make(shape, self.dtype, self.codec, parts, self)

    @torch.no_grad()
    def quantize(self, x: torch.Tensor):
        return make(x.shape, self.dtype, self.codec, self.parts(x), self)

    @torch.no_grad()
    def quantize_into(self, dst, x: torch.Tensor) -> None:
        """Re-quantize ``x`` into ``dst``'s existing parts, in place (optimizer write-back)."""
        for k, v in self.parts(x, dst.usages() or self.usages).items():
            if k in dst._parts:
                dst._parts[k].copy_(v)
            else:
                dst._parts[k] = v


def fake_quant(x2d: torch.Tensor, recipe: str, role: str, axes: tuple, state: QuantState | None,
               world_group=None) -> list[torch.Tensor]:
    """An activation (``role='input'``) or gradient (``'grad'``) GEMM operand, quantized and
    dequantized in fp32, once per contraction axis in ``axes`` (-1: blocks along the last dim,
    0: along the first). One scale / one history update serves all axes (TE casts a tensor and
    its transpose together)."""
    x = x2d.to(torch.float32)
    fmt = fp8.E5M2 if role == "grad" and recipe in ("delayed", "current") else fp8.E4M3
    if recipe in ("delayed", "current"):
        if recipe == "delayed":
            scale = state.scale(role).clone()
            state.record(role, _allreduce_max(fp8.amax(x), world_group), fmt)
            scale_inv = 1.0 / scale
        else:
            scale, scale_inv = fp8.current_scale(x, fmt)
        q = fp8.dequantize(fp8.quantize(x, scale, fmt), scale_inv, fmt)
        return [q for _ in axes]
    out = []
    for axis in axes:
        if recipe == "block":
            blk = (1, 128) if axis == -1 else (128, 1)
            d, s = blockfmt.quantize_blockwise(x, blk, fp8.E4M3, power_of_2_scales=True)
            out.append(blockfmt.dequantize_blockwise(d, s, blk))
        elif recipe == "mxfp8":
            d, s = mxfp8.quantize_mxfp8(x, axis=axis, scale_rounding=codecs.MX_ROUNDING)
            out.append(mxfp8.dequantize_mxfp8(d, s, axis=axis))
        elif recipe == "nvfp4":
            if x.shape[axis] % 2:
                out.append(x)  # an odd dim cannot be packed two per byte: kept high precision
                continue
            d, s, s_enc = nvfp4.quantize_nvfp4(x, axis=axis)
            out.append(nvfp4.dequantize_nvfp4(d, s, s_enc, x.shape, axis=axis))
        else:
            raise ValueError(recipe)
    return out
