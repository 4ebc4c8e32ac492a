"""TE #2974: ``QuantizedTensor.untyped_storage()`` returns an empty storage.

A wrapper subclass has no storage of its own (its bytes live in inner buffers). Its default
``untyped_storage()`` is an *invalid* storage whose ``data_ptr()`` raises. FSDP2's
``reset_sharded_param`` (run at lazy init and after every ``load_state_dict``, i.e. on DCP load)
compares ``_sharded_param_data.untyped_storage().data_ptr()`` with the local tensor's to decide
whether the shard is still the same tensor -> "Attempted to access the data pointer on an
invalid python storage". An empty storage (data_ptr 0) is never "the same" as a real one.
"""

import torch

from harness.reference.fixes import on

NAME = "empty_untyped_storage"


def untyped_storage(t: torch.Tensor) -> torch.UntypedStorage:
    if on(NAME):
        return torch.UntypedStorage(0, device=t.device)
    return torch.Tensor.untyped_storage(t)  # before the fix: the invalid wrapper storage
