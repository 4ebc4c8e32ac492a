"""Bytes on the wire: what FSDP2's all-gathers move for each parameter.

``recording()`` wraps ``FSDPParam.all_gather_inputs`` (the tensors FSDP2 hands to its
all-gather: a quantized tensor's ``fsdp_pre_all_gather`` outputs, else the shard itself) for
the duration of a block and records, per parameter, the dtype and bytes of every input and
the shard's element count. ``violations`` judges them: a quantized parameter must move its
quantized bytes -- every data-sized input (rowwise, columnwise) at most the format's bytes per
element of the parameter (FP8 / MXFP8: 1; NVFP4: 1/2, two E2M1 values packed per byte),
scale-sized inputs beside them -- never its dequantized values, nor unpacked codes.
"""

from __future__ import annotations

import contextlib
import threading

import torch

_lock = threading.Lock()
_active: list[dict] = []


def _record(fsdp_param, inputs) -> None:
    if not _active:
        return
    numel = torch.Size(fsdp_param.sharded_size).numel()
    entry = dict(numel=numel, inputs=[(str(t.dtype).removeprefix("torch."), t.numel(),
                                       t.numel() * t.element_size()) for t in inputs])
    for log in _active:
        log[fsdp_param._param_fqn or repr(fsdp_param)] = entry


@contextlib.contextmanager
def recording():
    """Yields {param fqn: {numel, inputs: [(dtype, numel, bytes)]}} of the all-gathers FSDP2
    runs inside the block."""
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
    log: dict = {}
    with _lock:
        if not _active:
            original = FSDPParam.__dict__["all_gather_inputs"]
            FSDPParam._harness_original_inputs = original

            def all_gather_inputs(self):
                inputs = original.fget(self)
                _record(self, inputs)
                return inputs
            FSDPParam.all_gather_inputs = property(all_gather_inputs)
        _active.append(log)
    try:
        yield log
    finally:
        with _lock:
            _active.remove(log)
            if not _active:
                FSDPParam.all_gather_inputs = FSDPParam._harness_original_inputs


def bytes_per_element(entry: dict) -> float:
    return sum(b for _, _, b in entry["inputs"]) / max(entry["numel"], 1)


def describe(name: str, entry: dict) -> str:
    parts = ", ".join(f"{d} x {n} = {b} B" for d, n, b in entry["inputs"])
    return f"{name}: {parts} for {entry['numel']} elements ({bytes_per_element(entry):.3g} B/element)"


BYTES_PER_ELEMENT = {"nvfp4": 0.5}  # recipe -> a data input's bytes per parameter element
DEFAULT_BYTES = 1.0  # FP8 formats: one byte per element


def violations(log: dict, quantized: list[str], recipe: str = "") -> list[str]:
    """Quantized parameters whose all-gather moved more than the recipe's bytes per element of
    the shard in a data-sized input (an input of at least 1/8 of the shard's elements), or
    that were not gathered at all."""
    limit = BYTES_PER_ELEMENT.get(recipe, DEFAULT_BYTES)
    bad = []
    for name in quantized:
        entry = log.get(name)
        if entry is None:
            bad.append(f"{name}: no all-gather recorded")
            continue
        data = [(d, n, b) for d, n, b in entry["inputs"] if n * 8 >= entry["numel"]]
        if not data or any(b > n for _, n, b in data):
            bad.append(describe(name, entry) + ": dequantized values on the wire, not the "
                                               "quantized bytes")
        elif any(b > limit * entry["numel"] for _, _, b in data):
            bad.append(describe(name, entry) + f": more than {limit:g} B/element in a data "
                                               f"input ({recipe or 'quantized'} moves {limit:g})")
    return bad
