"""(d) ``untyped_storage()`` per block-format class: Float8Blockwise, MXFP8, NVFP4 tensors.

These are wrapper subclasses; their bytes live in inner buffers. TE 2.20.2's
``QuantizedTensor.untyped_storage`` (#2974) returns a fresh 0-byte storage, whose
``data_ptr()`` is a null pointer -- which, the PR says, DCP's checkpoint loading treats as an
error. The PR gives each block class its own: the rowwise data's storage, else the columnwise
data's, else a 1-byte storage of the tensor's own (kept on the tensor, so repeated calls return
the same storage). Piece off: the class's inherited ``untyped_storage`` (TE's), looked up when
called.
"""

from __future__ import annotations

from typing import Callable

import torch

from harness.backends.te_tp import PortError, on, set_attr

NAME = "block_storage"
_MARK = "_te_tp_port"
_DEFAULT = "_te_tp_default_storage"
DATA = ("_rowwise_data", "_columnwise_data")


def te_classes() -> tuple:
    from harness.backends.te_tp.allgather_out import te_classes as all_classes
    _, blockwise, mxfp8, nvfp4 = all_classes()
    return blockwise, mxfp8, nvfp4


def storage(t) -> torch.UntypedStorage:
    """The port's ``untyped_storage()`` of a block-format tensor ``t``."""
    if not any(hasattr(t, a) for a in DATA):
        raise PortError(NAME, f"{type(t).__name__} has neither {' nor '.join(DATA)} (TE's block "
                              f"tensors keep their data elsewhere now)")
    for attr in DATA:
        data = getattr(t, attr, None)
        if data is not None:
            return data.untyped_storage()
    default = t.__dict__.get(_DEFAULT)
    if default is None:
        default = t.__dict__[_DEFAULT] = torch.UntypedStorage(1, device=t.device)
    return default


def install(classes=None) -> Callable[[], None]:
    """Give each class the port's ``untyped_storage``; returns the undo."""
    undo: list = []
    for cls in te_classes() if classes is None else classes:
        own = cls.__dict__.get("untyped_storage")
        if getattr(own, _MARK, False):
            continue

        def untyped_storage(self, _cls=cls, _own=own):
            if on(NAME):
                return storage(self)
            if _own is not None:
                return _own(self)
            return super(_cls, self).untyped_storage()
        setattr(untyped_storage, _MARK, True)
        set_attr(cls, "untyped_storage", untyped_storage, undo)
    return lambda: [fn() for fn in reversed(undo)]
