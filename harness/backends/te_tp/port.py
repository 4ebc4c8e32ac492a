"""``set_device_mesh(module, tp_mesh, weight_mesh)``: TE's own where the installed TE has it,
else the bundled port of PR #2713 (pieces (a), (b), (e)); and :func:`class_patches`, pieces (c)
and (d), which patch TE's quantized tensor classes for the duration of a case.

Call it on a TE module (or any module holding TE modules: it walks them) built for its TP rank
(``tp_size``, ``tp_group``, ``parallel_mode`` / ``set_parallel_mode``), before ``fully_shard``
and before ``reset_parameters`` -- on the ``meta`` device as the te backend builds, or after.
"""

from __future__ import annotations

import contextlib

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from harness.backends.te_tp import (
    BUNDLED,
    NATIVE,
    PortError,
    allgather_out,
    amax_group,
    block_storage,
    dtensor_params,
    on,
)
from harness.backends.te_tp import placements as rules


def native(module: nn.Module) -> bool:
    """Whether ``module``'s own class has TE's ``set_device_mesh`` (PR #2713 merged)."""
    return callable(getattr(type(module), "set_device_mesh", None))


def weight_group(weight_mesh):
    """The process group of ``weight_mesh``: a 1-D DeviceMesh (the PR's API) or a group."""
    if weight_mesh is None or not isinstance(weight_mesh, DeviceMesh):
        return weight_mesh
    if weight_mesh.ndim != 1:
        raise ValueError(f"weight_mesh must be 1-D (flatten its dims), got {weight_mesh.ndim}-D "
                         f"{weight_mesh.mesh_dim_names}")
    return weight_mesh.get_group()


def set_device_mesh(module: nn.Module, tp_mesh, weight_mesh=None) -> str:
    """PR #2713's ``set_device_mesh`` on ``module``: returns ``native`` (TE's own was called) or
    the port's name. ``weight_mesh``: a 1-D DeviceMesh or a process group (TE's own takes a
    DeviceMesh only; a group is not passed to it). Piece ``dtensor_params`` off: TE's own is
    not called either (TE before the PR)."""
    if tp_mesh is None:
        return NATIVE if native(module) else BUNDLED
    if tp_mesh.ndim != 1:
        raise ValueError(f"tp_mesh must be 1-D, got {tp_mesh.ndim}-D {tp_mesh.mesh_dim_names}")
    if native(module):
        if on("dtensor_params"):
            module.set_device_mesh(
                tp_mesh=tp_mesh,
                weight_mesh=weight_mesh if isinstance(weight_mesh, DeviceMesh) else None)
        return NATIVE
    group = weight_group(weight_mesh)
    for m in module.modules():
        cls = rules.rule_class(m)
        if cls is None or cls in rules.CHILDREN:
            continue
        _check_tp(m, cls, tp_mesh)
        dtensor_params.convert(m, tp_mesh)
        amax_group.configure(m, group)
    return BUNDLED


def localize(module: nn.Module) -> None:
    """A TE module that holds a DTensor parameter without ``set_device_mesh`` (a head tied to a
    DTensor-TP embedding) computes with its local tensor, as TE's forward does after the PR."""
    if not native(module):
        dtensor_params.localize(module)


def _check_tp(m: nn.Module, cls: str, tp_mesh) -> None:
    """As the PR: the module was built for this TP size; its TP group is the mesh's."""
    tp_size = getattr(m, "tp_size", None)
    if tp_size is not None and tp_size != tp_mesh.size():
        raise ValueError(f"{cls} was built with tp_size={tp_size}, tp_mesh has "
                         f"{tp_mesh.size()} ranks")
    if tp_size is not None and hasattr(m, "set_tensor_parallel_group"):
        m.set_tensor_parallel_group(tp_mesh.get_group())


@contextlib.contextmanager
def class_patches(classes=None):
    """Pieces (c), (d) and (e)'s pre-all-gather part on TE's quantized tensor classes for the
    block's duration (each consults its switch when called). ``classes``: (all-gather classes, block classes), for
    tests; default TE's. A class TE moved raises :class:`PortError` naming the piece."""
    gather, blocks = classes if classes is not None else (None, None)
    undo = [allgather_out.install(gather)]
    try:
        undo.append(block_storage.install(blocks))
        undo.append(amax_group.install(None if classes is None else gather))
        yield
    finally:
        for fn in reversed(undo):
            fn()


__all__ = ["set_device_mesh", "localize", "class_patches", "native", "weight_group",
           "PortError"]
