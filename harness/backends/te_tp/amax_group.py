"""(e) ``weight_mesh``: current-scaling weight amaxes reduced over every rank holding a piece of
the weight.

A per-tensor scale (Float8CurrentScaling; NVFP4's global scale) must come from the amax of the
whole weight. TE 2.20.2's ``reset_parameters`` sets ``amax_reduction_group`` for a DTensor
parameter to ``device_mesh.get_group("shard")`` (for a 2-D mesh) -- the FSDP shard dim only:
under FSDP2 x TP each TP shard gets a scale of its own. The PR takes the group from
``weight_mesh`` (FSDP-TP: shard x tp flattened; HSDP: the shard dim). The port wraps the
module's ``reset_parameters`` (an instance attribute, a bound method: deep copies rebind it):
after TE's own, each quantized parameter's quantizer and the module's weight quantizer get
``with_amax_reduction = True`` and ``amax_reduction_group = <weight group>``.

TE 2.20.2 also overrides the group per tensor, after the PR was written: every
``Float8Tensor.fsdp_pre_all_gather`` of a current-scaling shard sets
``self.amax_reduction_group = <FSDP2's mesh group>`` (the FSDP dim only), and
``quantize_`` -- FusedAdam's write-back of the master weights after each step -- reduces over
that tensor-level group first. So the port also wraps ``fsdp_pre_all_gather`` (:func:`install`,
a class patch for the case's duration): after TE's, a shard of an FSDP2 unit whose TE modules
the port configured gets their weight group as its tensor-level one. Without it TP shards train
on with a scale each (quantized_allgather_parity's ``shards_share_scale`` fails). Piece off:
TE's choice stays.
"""

from __future__ import annotations

import types
from typing import Callable

from torch.distributed.tensor import DTensor

from harness.backends.te_tp import PortError, on, set_attr

NAME = "amax_group"
QUANTIZERS = ("Float8CurrentScalingQuantizer", "NVFP4Quantizer")  # per-tensor amax
_GROUP = "_te_tp_amax_group"
_MARK = "_te_tp_port_amax"


def configure(module, group) -> bool:
    """Make ``module.reset_parameters`` end with :func:`apply` over ``group`` (a process group);
    only TE modules that quantize parameters (``param_init_meta``). True if configured."""
    if group is None or not hasattr(module, "param_init_meta"):
        return False
    if _GROUP not in module.__dict__:
        module.reset_parameters = types.MethodType(_reset_parameters, module)
    module.__dict__[_GROUP] = group
    return True


def install(classes=None) -> Callable[[], None]:
    """Wrap each class's ``fsdp_pre_all_gather`` (default: TE's Float8Tensor) so a shard keeps
    its weight group as the tensor-level amax group TE sets there; returns the undo."""
    if classes is None:
        try:
            from transformer_engine.pytorch.tensor.float8_tensor import Float8Tensor
        except ImportError as e:
            raise PortError(NAME, f"Float8Tensor is not where TE 2.20.2 keeps it: {e}") from None
        classes = (Float8Tensor,)
    undo: list = []
    for cls in classes:
        original = getattr(cls, "fsdp_pre_all_gather", None)
        if original is None:
            raise PortError(NAME, f"{cls.__name__} has no fsdp_pre_all_gather")
        if getattr(original, _MARK, False):
            continue

        pre_all_gather = _wrap(original)  # FSDP2 checks the hook's exact signature
        setattr(pre_all_gather, _MARK, True)
        set_attr(cls, "fsdp_pre_all_gather", pre_all_gather, undo)
    return lambda: [fn() for fn in reversed(undo)]


def _wrap(original):
    def pre_all_gather(self, mesh, orig_size, contiguous_orig_stride, module, mp_policy):
        result = original(self, mesh, orig_size, contiguous_orig_stride, module, mp_policy)
        group = weight_group_of(module)
        if group is not None and on(NAME):
            self.amax_reduction_group = group
        return result
    return pre_all_gather


def weight_group_of(fsdp_module):
    """The weight group the port configured for the TE modules of ``fsdp_module`` (the FSDP2
    unit whose shard is being gathered), or None where it configured none or several. Found
    through the modules, not the shard: the shard's own quantizer need not be the one
    ``reset_parameters`` configured (TE hands tensors quantizer copies)."""
    groups: list = []
    for m in fsdp_module.modules() if hasattr(fsdp_module, "modules") else ():
        g = m.__dict__.get(_GROUP)
        if g is not None and not any(g is x for x in groups):
            groups.append(g)
    return groups[0] if len(groups) == 1 else None


def _reset_parameters(self, defer_init=False):
    type(self).reset_parameters(self, defer_init=defer_init)
    if not defer_init:
        apply(self)


def _weight_quantizer(module, name):
    meta = module.param_init_meta.get(name)
    index = getattr(meta, "fp8_meta_index", None)
    fwd = (getattr(module, "quantizers", None) or {}).get("scaling_fwd")
    if index is None or not fwd:
        return None
    if isinstance(fwd, dict):
        return fwd.get(index)
    return fwd[index] if index < len(fwd) else None


def apply(module) -> int:
    """Point the weight quantizers of ``module``'s quantized parameters at the module's weight
    group; returns how many quantizers it set (0 with the piece off)."""
    group = module.__dict__.get(_GROUP)
    if not on(NAME) or group is None:
        return 0
    n = 0
    for name, p in module.named_parameters(recurse=False):
        t = p._local_tensor if isinstance(p, DTensor) else p
        own = getattr(t, "_quantizer", None)
        if own is None:  # not a quantized parameter
            continue
        for q in (own, _weight_quantizer(module, name)):
            if q is None or not (type(q).__name__ in QUANTIZERS
                                 or getattr(q, "with_amax_reduction", False)):
                continue
            if not hasattr(q, "amax_reduction_group"):
                raise PortError(NAME, f"{type(q).__name__} of {type(module).__name__}.{name} has "
                                      f"no amax_reduction_group (TE's quantizer API changed)")
            q.with_amax_reduction = True
            q.amax_reduction_group = group
            n += 1
        if getattr(t, "amax_reduction_group", None) is not None:  # a tensor-level override
            t.amax_reduction_group = group
    return n
