"""Mutants of the installed TransformerEngine: each reverts one fix of the seed pull requests at
run time (scenario axis ``mutation``, scenario ``te_mutations``), to prove on the TE that is
actually installed that the check named in its xfail entry still catches the bug.

Each mutant is a small function that patches TE classes in this worker process and returns the
function that undoes the patch; ``applied(name)`` applies one around a case. The names mirror
the reference backend's ``fixes`` switches (``no_<fix>``), so one table in the report shows a
fix and its mutant side by side. ``no_tp_<piece>`` switch off a piece of the bundled port of
#2713 (backends/te_tp), which stands in for what the installed TE lacks. Nothing here is
copied from TE: each patch only removes, wraps or re-routes what TE defines.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Callable

import torch
from torch.distributed.tensor import DTensor

from harness.backends.te_tp import set_attr


def _classes():
    from transformer_engine.pytorch.quantized_tensor import QuantizedTensor
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import (
        Float8BlockwiseQTensor,
    )
    from transformer_engine.pytorch.tensor.float8_tensor import Float8Tensor
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Tensor
    from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Tensor
    return QuantizedTensor, (Float8Tensor, Float8BlockwiseQTensor, MXFP8Tensor, NVFP4Tensor)


def _del(obj, name, undo: list) -> None:
    if name in obj.__dict__:
        old = obj.__dict__[name]
        undo.append(lambda: setattr(obj, name, old))
        delattr(obj, name)


def _undo_all(undo: list) -> Callable[[], None]:
    return lambda: [fn() for fn in reversed(undo)]


def no_quantized_allgather() -> Callable[[], None]:
    """FSDP2 FP8 / MXFP8 all-gather hooks removed: FSDP2 gathers the shards as they dispatch
    (dequantized values), as before TE's ``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``."""
    _, classes = _classes()
    undo: list = []
    for cls in classes:
        for name in ("fsdp_pre_all_gather", "fsdp_post_all_gather"):
            _del(cls, name, undo)
    return _undo_all(undo)


def no_empty_untyped_storage() -> Callable[[], None]:
    """#2974 reverted: ``QuantizedTensor.untyped_storage`` is torch's default again (the
    wrapper subclass's invalid storage, whose ``data_ptr()`` FSDP2 calls)."""
    qt, _ = _classes()
    undo: list = []
    set_attr(qt, "untyped_storage", torch.Tensor.untyped_storage, undo)
    return _undo_all(undo)


def no_to_copy_keeps_subclass() -> Callable[[], None]:
    """#2974 reverted: ``_to_copy`` and ``new_empty`` (how DCP stages a CPU copy for async
    saves) return plain high-precision tensors: the staged copy holds dequantized values."""
    _, classes = _classes()
    aten = torch.ops.aten
    undo: list = []
    for cls in classes:
        original = cls.__dict__["__torch_dispatch__"].__func__

        def dispatch(klass, func, types, args=(), kwargs=None, _orig=original):
            # before #2974 both ops took the generic path: run on the dequantized tensor
            if func in (aten._to_copy.default, aten.new_empty.default):
                return func(args[0].dequantize(), *args[1:], **(kwargs or {}))
            return _orig(klass, func, types, args, kwargs)
        set_attr(cls, "__torch_dispatch__", classmethod(dispatch), undo)
    return _undo_all(undo)


def no_weights_only_pickle() -> Callable[[], None]:
    """#2974 reverted: ``__reduce_ex__`` points at the bound classmethod ``_make_in_reduce_ex``
    (pickled as ``getattr(cls, name)``), which ``torch.load(weights_only=True)`` -- how DCP
    reads every checkpoint -- rejects."""
    _, classes = _classes()
    undo: list = []
    for cls in classes:
        if "__reduce_ex__" not in cls.__dict__ or "_make_in_reduce_ex" not in cls.__dict__:
            continue
        original = cls.__dict__["__reduce_ex__"]
        n_args = len(inspect.signature(cls._make_in_reduce_ex).parameters)

        def reduce_ex(self, protocol, _orig=original, _n=n_args):
            _, args = _orig(self, protocol)
            return type(self)._make_in_reduce_ex, tuple(args[:_n])
        set_attr(cls, "__reduce_ex__", reduce_ex, undo)
    return _undo_all(undo)


def no_optimizer_dtensor_state() -> Callable[[], None]:
    """#2795 reverted: FusedAdam keeps its states (exp_avg, exp_avg_sq, master_param) as plain
    local tensors for DTensor parameters and ``state_dict()`` hands them out as such, as before
    the PR; its step still runs on the local shards (the states are wrapped as DTensors only for
    the duration of ``step``, which since #2795 asserts the parity)."""
    from transformer_engine.pytorch.optimizers import FusedAdam
    undo: list = []
    original = FusedAdam.__dict__["step"]
    original_state_dict = FusedAdam.__dict__["state_dict"]

    def state_dict(self):
        sd = original_state_dict(self)
        for st in sd["state"].values():
            for k, v in list(st.items()):
                if isinstance(v, DTensor):
                    st[k] = v._local_tensor
        return sd
    set_attr(FusedAdam, "state_dict", state_dict, undo)

    def step(self, *args, **kwargs):
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state.get(p, {})
                if isinstance(p, DTensor):
                    for k, v in st.items():
                        if isinstance(v, torch.Tensor) and not isinstance(v, DTensor) and v.dim():
                            st[k] = DTensor.from_local(v, p.device_mesh, p.placements,
                                                       shape=p.size(), stride=p.stride())
        try:
            return original(self, *args, **kwargs)
        finally:
            for st in self.state.values():
                for k, v in list(st.items()):
                    if isinstance(v, DTensor):
                        st[k] = v._local_tensor
    set_attr(FusedAdam, "step", step, undo)
    return _undo_all(undo)


def no_tp(piece: str) -> Callable[[], Callable[[], None]]:
    """A piece of the #2713 port (backends/te_tp) switched off: on a TE without its own
    ``set_device_mesh`` that piece is what TE lacks again (``no_tp_dtensor_params``: TP shards
    stay plain parameters, as before the PR -- with TE's own, its call is skipped too)."""
    from harness.backends import te_tp
    return lambda: te_tp.switch_off(piece)


MUTANTS: dict[str, Callable[[], Callable[[], None]]] = {
    "no_optimizer_dtensor_state": no_optimizer_dtensor_state,
    "no_to_copy_keeps_subclass": no_to_copy_keeps_subclass,
    "no_empty_untyped_storage": no_empty_untyped_storage,
    "no_quantized_allgather": no_quantized_allgather,
    "no_weights_only_pickle": no_weights_only_pickle,
    **{f"no_tp_{piece}": no_tp(piece) for piece in ("dtensor_params", "local_identity",
                                                     "allgather_out", "block_storage",
                                                     "amax_group")},
}


CLEAN = ("none", "rerun", "rerun2")  # TE as installed: the clean case and its reruns


def _consistent() -> None:
    from harness.spec import catalog
    assert set(MUTANTS) | set(CLEAN) == set(catalog.MUTATIONS), "catalog.MUTATIONS lists the mutants"


_consistent()


@contextlib.contextmanager
def applied(name: str):
    """The mutant ``name`` patched into TE for the duration of the block (``none`` and
    ``rerun`` / ``rerun2``, the clean case again to measure run-to-run noise: nothing)."""
    if not name or name in CLEAN:
        yield
        return
    undo = MUTANTS[name]()
    try:
        yield
    finally:
        undo()
