"""(b) A TE module's TP-local parameters become DTensors on the TP mesh; forward still computes
with plain local tensors.

:func:`convert` replaces each of a leaf module's own parameters by
``nn.Parameter(DTensor.from_local(local, tp_mesh, [placement]))`` (placements.py) -- before
``fully_shard`` (which then shards TP's dim-0 shards again with ``_StridedShard``) and before
``reset_parameters`` (TE 2.20.2's handles DTensor parameters: it initializes and quantizes the
local tensor and re-wraps it with the same placements).

TE's kernels need plain tensors, and TE reads its parameters as attributes inside ``forward``
(``self.weight``, ``self.fc1_weight``, ``self.softmax_offset``, ...). So around ``forward`` --
a pre-hook that runs after FSDP2's unshard, a post-hook (prepended, always called) that runs
before FSDP2's reshard -- the module's DTensor parameters are swapped for their local tensors
and back. The local tensor is the DTensor's own ``_local_tensor`` object, passed through an
identity autograd function (the PR's ``_ToLocalIdentity``): FSDP2's backward re-gather refills
that very object in place, and the gradient flows back to the DTensor parameter as a DTensor.
Piece ``local_identity`` off: ``to_local()`` instead (a new alias of the local tensor).

:func:`tp_local_full` is for piece ``dtensor_params`` off (plain TP shards, TE before the PR):
the full state dict the te backend loads, sliced to this TP rank's shards where a parameter is
a TP shard.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from harness.backends.te_tp import on, placements
from harness.reference.fixes.tp_dtensor_params import _ToLocalIdentity

NAME = "dtensor_params"
_HOOKED = "_te_tp_localized"  # module attribute: the forward hooks are registered
_SWAPPED = "_te_tp_swapped"  # module attribute: a stack of (name, DTensor, local) swaps


def convert(module: nn.Module, tp_mesh) -> list[str]:
    """``module``'s own parameters (a leaf TE module) as DTensors on ``tp_mesh``, with the
    forward hooks; returns the names converted (none with the piece off)."""
    if not on(NAME):
        return []
    done = []
    for name, pl in placements.module_placements(module).items():
        p = module._parameters[name]
        if p is None or isinstance(p, DTensor):
            continue
        d = nn.Parameter(DTensor.from_local(p.detach(), tp_mesh, [pl], run_check=False),
                         requires_grad=p.requires_grad)
        for attr, value in vars(p).items():  # TE's tags on the parameter (sequence_parallel...)
            setattr(d, attr, value)
        setattr(module, name, d)
        done.append(name)
    if done:
        localize(module)
    return done


def localize(module: nn.Module) -> None:
    """Hooks that hand ``module``'s forward the local tensors of its DTensor parameters (the
    PR does this for every TE module: e.g. a head whose weight is tied to a DTensor-TP
    embedding, on which ``set_device_mesh`` is not called). Idempotent."""
    if not module.__dict__.get(_HOOKED):
        module.register_forward_pre_hook(_swap_in)
        module.register_forward_hook(_swap_out, prepend=True, always_call=True)
        module.__dict__[_HOOKED] = True


def local(d: DTensor) -> torch.Tensor:
    """What TE computes with: the DTensor's local tensor object (identity autograd), or with
    ``local_identity`` off a ``to_local()`` alias."""
    if not on("local_identity"):
        return d.to_local()
    return _ToLocalIdentity.apply(d) if d.requires_grad else d._local_tensor


def _swap_in(module, args) -> None:
    swapped = []
    for name, d in list(module._parameters.items()):
        if isinstance(d, DTensor):  # FSDP2's unsharded parameters are TP DTensors or plain
            t = local(d)
            module._parameters[name] = t  # not a Parameter: only for the forward's duration
            swapped.append((name, d, t))
    module.__dict__.setdefault(_SWAPPED, []).append(swapped)


def _swap_out(module, args, output) -> None:
    stack = module.__dict__.get(_SWAPPED)
    if not stack:
        return
    for name, d, t in stack.pop():
        if module._parameters.get(name) is t:  # unless something else replaced it meanwhile
            module._parameters[name] = d


def tp_local_full(model: nn.Module, full: dict, tp_rank: int, tp_size: int) -> dict:
    """``full`` (whole tensors by name) with each entry whose parameter in ``model`` is a plain
    TP shard (its shape differs from the whole tensor's) cut to this TP rank's shard along its
    placement's dim. With the port's DTensors the shapes agree and nothing changes."""
    out = dict(full)
    for key, t in full.items():
        owner_name, _, pname = key.rpartition(".")
        try:
            owner = model.get_submodule(owner_name)
        except AttributeError:
            continue
        p = owner._parameters.get(pname)
        if p is None or not isinstance(t, torch.Tensor) or tuple(p.shape) == tuple(t.shape):
            continue
        cls = placements.rule_class(owner)
        if cls is None:
            continue
        pl = placements.placement(cls, getattr(owner, "parallel_mode", None), pname)
        if isinstance(pl, Shard):
            out[key] = t.chunk(tp_size, pl.dim)[tp_rank]
    return out
