"""Device meshes and the plain-torch parallelization: TP with parallelize_module, then
fully_shard on the data-parallel dims (HSDP when the mesh has a replicate dim)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import parallelize_module

from harness.spec.mesh import REPLICATE, SHARD, TP, MeshSpec


def device_mesh(spec: MeshSpec, device_type: str, names: dict | None = None) -> DeviceMesh:
    """``names`` renames the harness's dims (dp_replicate / dp_shard / tp) for backends that
    look them up under other names (TE: replicate / shard / tp)."""
    dims, sizes = zip(*spec.dims)
    names = names or {}
    return init_device_mesh(device_type, tuple(sizes),
                            mesh_dim_names=tuple(names.get(d, d) for d in dims))


def mixed_precision(recipe: str, reduce_dtype: torch.dtype | None = None
                    ) -> MixedPrecisionPolicy | None:
    """FSDP2's policy for ``recipe``: bf16 computes in bf16 and reduces in fp32; ``reduce_dtype``
    (a sized bug's) reduces the gradients in that dtype instead."""
    if recipe == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                    reduce_dtype=reduce_dtype or torch.float32)
    return MixedPrecisionPolicy(reduce_dtype=reduce_dtype) if reduce_dtype else None


def fsdp_mesh(mesh: DeviceMesh, spec: MeshSpec, names: dict | None = None) -> DeviceMesh:
    dims = tuple((names or {}).get(d, d) for d in spec.fsdp_dims)
    return mesh[dims] if len(dims) > 1 else mesh[dims[0]]


_WEIGHT_GROUPS: dict = {}


def weight_group(mesh: DeviceMesh, spec: MeshSpec):
    """Ranks holding pieces of one weight: the FSDP shard dim x TP (never HSDP's replicas).

    Built with ``new_subgroups_by_enumeration`` (collective: every rank creates every group)
    and cached per mesh; not via ``DeviceMesh._flatten``, which stores process groups in the
    mesh that DTensor specs reference -- DCP's async staging deep-copies those and cannot
    pickle a ProcessGroup.
    """
    if spec.tp == 1:
        return mesh[SHARD].get_group()
    if spec.shard == 1 and not spec.hsdp:  # the TP ranks alone (the TP twin's mesh, made by
        return mesh[TP].get_group()       # its ranks alone: no enumeration over the world)
    if spec.name not in _WEIGHT_GROUPS:
        by_replica: dict[int, list[int]] = {}
        for r in range(spec.world_size):
            by_replica.setdefault(spec.coords(r).get(REPLICATE, 0), []).append(r)
        group, _ = dist.new_subgroups_by_enumeration(list(by_replica.values()))
        _WEIGHT_GROUPS[spec.name] = group
    return _WEIGHT_GROUPS[spec.name]


def mesh_group(mesh: DeviceMesh):
    """The process group spanning every rank of ``mesh``: its group when 1-D, else that of its
    one dim of size > 1 (the TP twin's one-rank shard dim x TP)."""
    if mesh.ndim == 1:
        return mesh.get_group()
    wide = [d for d, n in zip(mesh.mesh_dim_names, mesh.shape) if n > 1]
    if len(wide) != 1:
        raise ValueError(f"no one group spans mesh {mesh.mesh_dim_names} {tuple(mesh.shape)}")
    return mesh.get_group(wide[0])


def parallelize(model: nn.Module, mesh: DeviceMesh, spec: MeshSpec, recipe: str,
                plan: dict | None = None, reduce_dtype: torch.dtype | None = None) -> nn.Module:
    """TP with ``plan`` (default ``model.tp_plan()``), then ``shard``. Tied parameters stay
    tied: ``parallelize_module`` distributes each module's parameters on its own, so an alias
    of a tied parameter would become a second DTensor; it is re-tied to the first."""
    if spec.tp > 1:
        ties = tied_groups(model)
        apply_tp(model, mesh[TP], plan if plan is not None else model.tp_plan())
        retie(model, ties)
    return shard(model, mesh, spec, recipe, reduce_dtype=reduce_dtype)


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, plan) -> None:
    """``parallelize_module(model, tp_mesh, plan)``. Over a gloo group on CUDA tensors (ranks
    sharing a GPU: the harness's choice, never a user's) each ColwiseParallel that gathers its
    output gathers it with c10d (``tp_output.c10d_gathered``): DTensor's own gather segfaults
    there (torch 2.11: every rank, in training). Elsewhere the plan runs as it is."""
    from harness.distributed.tp_output import c10d_gathered
    if tp_mesh.device_type == "cuda" and dist.get_backend(tp_mesh.get_group()) == "gloo":
        plan = ({k: c10d_gathered(s) for k, s in plan.items()} if isinstance(plan, dict)
                else c10d_gathered(plan))
    parallelize_module(model, tp_mesh, plan)


def tied_groups(model: nn.Module) -> list[tuple[str, ...]]:
    """Names under which one parameter is registered more than once (tied weights), each group
    in registration order: [("embed.weight", "lm_head.weight")]."""
    by_param: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_param.setdefault(id(p), []).append(name)
    return [tuple(names) for names in by_param.values() if len(names) > 1]


def retie(model: nn.Module, groups: list[tuple[str, ...]]) -> None:
    """Register the first name's parameter under every other name of its group."""
    for first, *aliases in groups:
        p = model.get_parameter(first)
        for name in aliases:
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner) if owner else model, attr, p)


def shard(model: nn.Module, mesh: DeviceMesh, spec: MeshSpec, recipe: str, units=None,
          names: dict | None = None, reduce_dtype: torch.dtype | None = None) -> nn.Module:
    """fully_shard each FSDP unit, then the root (HSDP on a 2-D replicate x shard mesh)."""
    kwargs = dict(mesh=fsdp_mesh(mesh, spec, names))
    mp = mixed_precision(recipe, reduce_dtype)
    if mp is not None:
        kwargs["mp_policy"] = mp
    if units is None:
        units = model.fsdp_units() if hasattr(model, "fsdp_units") else []
    for unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    return model
