"""(c) ``fsdp_post_all_gather(..., out=...)`` with FSDP2's DTensor ``out`` unwrapped.

From its second all-gather on, FSDP2 refills the unsharded parameter in place:
``inner.fsdp_post_all_gather(outputs, metadata, dtype, out=unsharded_param)``. Under FSDP2 x TP
that parameter is a DTensor on the TP mesh, and TE 2.20.2's quantized tensors write into
``out`` as if it were one of theirs (``out._data = ...``, ``out._rowwise_data = ...``,
``out._quantizer.set_usage(...)``, ``out.update_usage(...)``): attributes of the DTensor, not of
its local tensor -- which keeps stale buffers, or the call fails. The PR hands TE the DTensor's
local tensor; so does this wrapper of each class's ``fsdp_post_all_gather`` (piece off: the
DTensor goes through as before).
"""

from __future__ import annotations

from typing import Callable

from torch.distributed.tensor import DTensor

from harness.backends.te_tp import PortError, on, set_attr

NAME = "allgather_out"
_MARK = "_te_tp_port"


def te_classes() -> tuple:
    """TE 2.20.2's quantized tensor classes with FSDP2 all-gather hooks."""
    try:
        from transformer_engine.pytorch.tensor.float8_blockwise_tensor import (
            Float8BlockwiseQTensor,
        )
        from transformer_engine.pytorch.tensor.float8_tensor import Float8Tensor
        from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Tensor
        from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Tensor
    except ImportError as e:
        raise PortError(NAME, f"TE's quantized tensor classes are not where TE 2.20.2 keeps "
                              f"them (transformer_engine.pytorch.tensor.*): {e}") from None
    return Float8Tensor, Float8BlockwiseQTensor, MXFP8Tensor, NVFP4Tensor


def install(classes=None) -> Callable[[], None]:
    """Wrap each class's ``fsdp_post_all_gather``; returns the undo."""
    undo: list = []
    for cls in te_classes() if classes is None else classes:
        original = getattr(cls, "fsdp_post_all_gather", None)
        if original is None:
            raise PortError(NAME, f"{cls.__name__} has no fsdp_post_all_gather (TE's FSDP2 "
                                  f"all-gather hooks moved or were renamed)")
        if getattr(original, _MARK, False):
            continue

        def post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None,
                            _original=original):
            if isinstance(out, DTensor) and on(NAME):
                out = out._local_tensor
            return _original(self, all_gather_outputs, metadata, param_dtype, out=out)
        setattr(post_all_gather, _MARK, True)
        set_attr(cls, "fsdp_post_all_gather", post_all_gather, undo)
    return lambda: [fn() for fn in reversed(undo)]
