"""The dispatch ops of the reference QuantizedTensor (``qtensor.py``): what FSDP2 and DCP call
on a quantized parameter -- views, slices, splits, copies, new / empty / zeros, ``_to_copy``
-- done on the raw parts, and every other op on the dequantized values (``fallback``)."""

from __future__ import annotations

import torch

from harness.reference.fixes import partial_slice_view, to_copy_keeps_subclass

aten = torch.ops.aten


def is_quantized(x) -> bool:
    """A reference QuantizedTensor (known by its raw parts and codec)."""
    return isinstance(x, torch.Tensor) and hasattr(x, "_parts") and hasattr(x, "_codec")


def _like(t, shape, parts):
    return type(t)(shape, t.dtype, t._codec, parts, t._quantizer)


def _alias(t, *_, **__):
    return _like(t, t.shape, t._parts)


def _view(t, size, *_, **__):
    size = list(size)
    if -1 in size:
        known = 1
        for s in size:
            known *= s if s != -1 else 1
        size[size.index(-1)] = t.numel() // max(known, 1)
    if tuple(size) == tuple(t.shape):
        return _alias(t)
    return NotImplemented  # a real reshape of blocked data: dequantize (like TE)


def _bounds(t, dim, start, end) -> tuple[int, int, int]:
    """``aten.slice``'s dim, start and end on ``t``, made whole and non-negative."""
    dim = dim % t.dim()
    size = t.shape[dim]
    start = 0 if start is None else (start + size if start < 0 else min(start, size))
    end = size if end is None else (end + size if end < 0 else min(end, size))
    return dim, start, max(end, start)


def _slice(t, dim=0, start=None, end=None, step=1):
    if step != 1:
        return NotImplemented
    dim, start, end = _bounds(t, dim, start, end)
    size = t.shape[dim]
    parts = {k: t._codec.slice_part(k, v, dim, start, end, size) for k, v in t._parts.items()}
    shape = list(t.shape)
    shape[dim] = end - start
    return _like(t, shape, parts)


def _slice_op(t, dim=0, start=None, end=None, step=1):
    """``aten.slice``; a partial slice of a blocked format without the fix: a dequantized copy
    (the fallback), as TE 2.20.2 makes it."""
    d, lo, hi = _bounds(t, dim, start, end)
    if not partial_slice_view.keeps_view(t._codec.name, (lo, hi) == (0, t.shape[d])):
        return NotImplemented
    return _slice(t, dim, start, end, step)


def _split(t, split_size, dim=0):
    size = t.shape[dim % t.dim()]
    bounds = list(range(0, size, split_size)) if split_size else [0]
    return [_slice(t, dim, b, min(b + split_size, size)) for b in bounds]


def _split_with_sizes(t, sizes, dim=0):
    out, start = [], 0
    for s in sizes:
        out.append(_slice(t, dim, start, start + s))
        start += s
    return out


def _as_strided(t, size, stride, storage_offset=0):
    contiguous = torch.empty(tuple(size), device="meta").stride()
    if tuple(size) == tuple(t.shape) and tuple(stride) == contiguous and not storage_offset:
        return _alias(t)
    raise NotImplementedError(f"as_strided{tuple(size)}/{tuple(stride)} of a quantized tensor")


def _copy_(dst, src, non_blocking=False):
    if is_quantized(dst):
        if is_quantized(src):
            if src._codec is not dst._codec or tuple(src.shape) != tuple(dst.shape):
                src = src.dequantize()
            else:
                for k, v in src._parts.items():
                    if k in dst._parts and dst._parts[k].shape == v.shape:
                        dst._parts[k].copy_(v, non_blocking=non_blocking)
                    else:
                        dst._parts[k] = v.to(dst.device, copy=True)
                return dst
        if dst._quantizer is None:
            raise RuntimeError("copy_ of high-precision values into a QuantizedTensor that has "
                               "no quantizer (a tensor rebuilt from a checkpoint)")
        dst._quantizer.quantize_into(dst, src.to(dst.device))
        return dst
    dst.copy_(src.dequantize(), non_blocking=non_blocking)
    return dst


def _new_quantized(t, shape, device, fill: str):
    # An explicit device is how DCP asks for a staging copy (new_empty(..., device="cpu")).
    if device is not None and not to_copy_keeps_subclass.keeps_subclass():
        if fill == "empty":  # before the fix: a copy of the high-precision values
            return t.dequantize().to(device)
        return torch.zeros(shape, dtype=t.dtype, device=device)
    device = torch.device(device) if device is not None else t.device
    parts = {}
    for k, v in t._parts.items():
        pshape = t._codec.part_shape(k, shape)
        parts[k] = (torch.ones if t._codec.factors[k] is None else torch.zeros)(
            pshape, dtype=v.dtype, device=device)
    return type(t)(shape, t.dtype, t._codec, parts, t._quantizer)


def _new_zeros(t, size, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is not None and dtype != t.dtype:
        return torch.zeros(size, dtype=dtype, device=device or t.device)
    return _new_quantized(t, tuple(size), device, "zeros")


def _new_empty(t, size, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is not None and dtype != t.dtype:
        return torch.empty(size, dtype=dtype, device=device or t.device)
    return _new_quantized(t, tuple(size), device, "empty")


def _empty_like(t, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    if dtype is not None and dtype != t.dtype:
        return torch.empty(t.shape, dtype=dtype, device=device or t.device)
    # not a staging copy (e.g. Module.to_empty): always a quantized tensor
    parts = {k: torch.empty(v.shape, dtype=v.dtype, device=device or v.device)
             for k, v in t._parts.items()}
    return _like(t, t.shape, parts)


def _zeros_like(t, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _new_zeros(t, t.shape, dtype=dtype, device=device)


def _clone(t, memory_format=None):
    return _like(t, t.shape, {k: v.clone() for k, v in t._parts.items()})


def _to_copy(t, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    device = torch.device(device) if device is not None else t.device
    if dtype is not None and dtype != t.dtype:
        return t.dequantize(dtype=dtype).to(device)
    if not to_copy_keeps_subclass.keeps_subclass():
        return t.dequantize().to(device)  # before the fix: dequantized values
    parts = {k: v.to(device, non_blocking=non_blocking, copy=True) for k, v in t._parts.items()}
    return type(t)(t.shape, t.dtype, t._codec, parts, t._quantizer)


def _zero_(t):
    for k, v in t._parts.items():
        (v.fill_(1) if t._codec.factors[k] is None else v.zero_())
    return t


_OPS = {
    aten.detach.default: _alias, aten.alias.default: _alias, aten.view.default: _view,
    aten._unsafe_view.default: _view, aten.slice.Tensor: _slice_op, aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split_with_sizes, aten.as_strided.default: _as_strided,
    aten.copy_.default: _copy_, aten.new_zeros.default: _new_zeros,
    aten.new_empty.default: _new_empty, aten.empty_like.default: _empty_like,
    aten.zeros_like.default: _zeros_like, aten.clone.default: _clone,
    aten._to_copy.default: _to_copy, aten.zero_.default: _zero_,
}


def _fallback(func, args, kwargs):
    """Dequantize every QuantizedTensor argument and run ``func`` on plain tensors; an in-place
    op on a QuantizedTensor re-quantizes the result into it."""
    def unwrap(x):
        return x.dequantize() if is_quantized(x) else x
    flat_args = torch.utils._pytree.tree_map(unwrap, args)
    flat_kwargs = torch.utils._pytree.tree_map(unwrap, kwargs)
    out = func(*flat_args, **flat_kwargs)
    if func._schema.is_mutable and args and is_quantized(args[0]):
        _copy_(args[0], flat_args[0])
        return args[0]
    return out


