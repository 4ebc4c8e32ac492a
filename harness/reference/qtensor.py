"""QuantizedTensor: a torch.Tensor wrapper subclass holding a quantized tensor's raw parts.

Logical shape and dtype are those of the high-precision tensor; the bytes live in ``_parts``
(see codecs.py). ``__torch_dispatch__`` implements the ops FSDP2 and DCP use on parameters
(detach, view, split / slice, as_strided, copy_, new_zeros / new_empty / empty_like, clone,
_to_copy, zero_) without dequantizing; anything else dequantizes (the result is a plain tensor,
an in-place op re-quantizes into ``self``).

``FSDPQuantizedTensor`` adds FSDP2's all-gather extension (fixes/quantized_allgather.py):
``fsdp_pre_all_gather`` sends the parts for the usage the GEMMs need (rowwise in forward,
columnwise in a backward re-gather, both when the module does not reshard after forward),
``fsdp_post_all_gather`` rebuilds the quantized tensor (in place on a re-gather, under
``torch.autograd._unsafe_preserve_version_counter``).
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from harness.reference import codecs
from harness.reference.fixes import (
    empty_untyped_storage,
    quantized_allgather,
    weights_only_pickle,
)
from harness.reference.qtensor_ops import _OPS, _fallback

aten = torch.ops.aten


class QuantizedTensor(torch.Tensor):
    @staticmethod
    def __new__(cls, shape, dtype, codec, parts, quantizer=None, requires_grad=False):
        device = next(v.device for v in parts.values())
        t = torch.Tensor._make_wrapper_subclass(cls, tuple(shape), dtype=dtype, device=device,
                                                requires_grad=requires_grad)
        t._codec, t._parts, t._quantizer = codec, dict(parts), quantizer
        return t

    def __init__(self, *args, **kwargs):
        pass

    # --- inspection -----------------------------------------------------------------------
    def usages(self) -> set:
        return self._codec.available(self._parts)

    def dequantize(self, usage: str | None = None, dtype: torch.dtype | None = None):
        if usage is None:
            usage = "row" if "row" in self.usages() else "col"
        return self._codec.dequantize(self._parts, tuple(self.shape), usage).to(dtype or self.dtype)

    def raw_parts(self) -> dict:
        return dict(self._parts)

    def __repr__(self, *, tensor_contents=None):
        parts = ", ".join(f"{k}{list(v.shape)}" for k, v in self._parts.items())
        return f"{type(self).__name__}({self._codec.name}, shape={list(self.shape)}, {parts})"

    # --- the fixes ------------------------------------------------------------------------
    def untyped_storage(self):
        return empty_untyped_storage.untyped_storage(self)

    def __reduce_ex__(self, protocol):
        state = (self._codec.name, tuple(self.shape), self.dtype, dict(self._parts))
        if weights_only_pickle.fixed():
            return _rebuild_quantized, state
        return type(self)._rebuild, state  # before the fix: pickles as getattr(cls, "_rebuild")

    @classmethod
    def _rebuild(cls, codec_name, shape, dtype, parts):
        return _rebuild_quantized(codec_name, shape, dtype, parts)

    # --- dispatch -------------------------------------------------------------------------
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _OPS.get(func)
        if handler is not None:
            out = handler(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return _fallback(func, args, kwargs)


class FSDPQuantizedTensor(QuantizedTensor):
    """QuantizedTensor with FSDP2's all-gather extension hooks."""

    def fsdp_pre_all_gather(self, mesh, orig_size, contiguous_orig_stride, module, mp_policy):
        usages = _gather_usages(module, self.usages())
        names = self._codec.parts_for(usages)
        gathered = tuple(n for n in names if self._codec.factors[n] is not None)
        scalars = {n: self._parts[n] for n in names if self._codec.factors[n] is None}
        inputs = tuple(self._parts[n].contiguous() for n in gathered)
        layout = None
        if mesh.size() == 1 and len(inputs) > 1:  # torch's one-rank path copies input 0 only
            inputs, layout = _pack(inputs)
        return inputs, (gathered, scalars, tuple(orig_size), self._quantizer, layout)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        names, scalars, orig_size, quantizer, layout = metadata
        gathered = _unpack(all_gather_outputs[0], layout) if layout else all_gather_outputs
        parts = dict(zip(names, gathered))
        parts.update(scalars)
        if out is not None:  # backward re-gather: refill the tensor autograd saved
            target = out._local_tensor if isinstance(out, DTensor) else out
            with torch.autograd._unsafe_preserve_version_counter(target):
                target._parts = parts
            return
        t = FSDPQuantizedTensor(orig_size, self.dtype, self._codec, parts, quantizer)
        return t, tuple(all_gather_outputs)


_ALIGN = 16  # bytes: every packed part starts where any dtype may view it


def _pack(inputs: tuple) -> tuple[tuple, tuple]:
    """All of a parameter's parts as ONE uint8 buffer, and where each lies in it. FSDP2 on a
    one-rank shard mesh (the sharding-invariance twin, an HSDP mesh of shard size 1) does no
    all-gather: it copies the first all-gather input into the unsharded buffer and hands only
    that to ``fsdp_post_all_gather`` -- the other parts (a blocked format's scales, MXFP8 /
    NVFP4's columnwise copy) would be lost (TE 2.20's block tensors fail there: "not enough
    values to unpack", scenarios/xfails.yaml)."""
    layout, offset = [], 0
    for t in inputs:
        layout.append((offset, t.dtype, tuple(t.shape)))
        offset += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
    buf = torch.zeros(offset, dtype=torch.uint8, device=inputs[0].device)
    for (start, _, _), t in zip(layout, inputs):
        raw = t.reshape(-1).view(torch.uint8)
        buf[start:start + raw.numel()] = raw
    return (buf,), tuple(layout)


def _unpack(buf: torch.Tensor, layout: tuple) -> tuple:
    """The parts of ``_pack``'s buffer as views of it (FSDP2 frees the buffer on reshard)."""
    out = []
    for start, dtype, shape in layout:
        n = torch.Size(shape).numel() * dtype.itemsize
        out.append(buf[start:start + n].view(dtype).view(shape))
    return tuple(out)


def make(shape, dtype, codec, parts, quantizer=None) -> QuantizedTensor:
    """A QuantizedTensor of the class the current fixes ask for."""
    cls = FSDPQuantizedTensor if quantized_allgather.enabled() else QuantizedTensor
    return cls(shape, dtype, codec, parts, quantizer)


def _rebuild_quantized(codec_name, shape, dtype, parts):
    """Module-level reconstructor for pickling (allow-listed for weights_only loads)."""
    return make(shape, dtype, codecs.CODECS[codec_name], parts)


weights_only_pickle.safe_globals([_rebuild_quantized])


def _gather_usages(module, have: set) -> set:
    """rowwise for the forward, columnwise for a backward re-gather, both when the module keeps
    its unsharded params from forward to backward (it does not reshard after forward)."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
    state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
    group = getattr(state, "_fsdp_param_group", None)
    if group is None:
        return have
    if group._training_state == TrainingState.PRE_BACKWARD:
        return {"col"} & have or have
    if group.post_forward_mesh_info is None:
        return have
    return {"row"} & have or have


def add_parts(local, g, key: str, t) -> None:
    """Queue the raw parts of ``t`` (a DTensor whose local tensor is ``local``) on gatherer
    ``g`` under ``key#part``: sharded parts to full size, per-tensor scalars (a scale, NVFP4's
    global scale) as one value when every rank holds the same one, else the per-rank vector --
    so shards quantized with different scales show up in any comparison."""
    for k, v in sorted(local._parts.items()):
        if local._codec.factors[k] is None:
            g.add_scalar(f"{key}#{k}", v)
        else:
            g.add(f"{key}#{k}", t, v, local._codec.part_shape(k, t.shape))


def full_parts(t) -> dict:
    """The raw parts of a (DTensor of a) QuantizedTensor at full size (collective for
    DTensors: whole on rank 0, placeholders elsewhere -- distributed/gather.py)."""
    from harness.distributed.gather import Gather
    if not isinstance(t, DTensor):
        return {k: v.detach().cpu().clone() for k, v in t._parts.items()}
    g = Gather()
    add_parts(t._local_tensor, g, "t", t)
    return {k[2:]: v for k, v in g.run().items()}


QuantizedTensor.add_parts = add_parts
QuantizedTensor.full_parts = staticmethod(full_parts)


def assemble(chunks: list, shape) -> dict:
    """Full-size raw parts from DCP chunks [(logical offsets, QuantizedTensor), ...]."""
    codec = chunks[0][1]._codec
    out = {}
    for k in chunks[0][1]._parts:
        if codec.factors[k] is None:
            vals = [c._parts[k] for _, c in chunks]
            same = all(torch.equal(a.view(-1).view(torch.uint8), vals[0].view(-1).view(torch.uint8))
                       for a in vals)
            out[k] = vals[0] if same else torch.stack(vals)
            continue
        f = codec.factors[k]
        full = torch.zeros(codec.part_shape(k, shape), dtype=chunks[0][1]._parts[k].dtype)
        for offsets, c in chunks:
            part = c._parts[k]
            idx = tuple(slice(o // fk, o // fk + n) for o, fk, n in zip(offsets, f, part.shape))
            full[idx] = part
        out[k] = full
    return out


QuantizedTensor.assemble = staticmethod(assemble)
