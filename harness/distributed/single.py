"""The sharding-invariance twin: the case's own recipe and module without data parallelism.

Same backend, build, optimizer, autocast, seed, data and steps as the sharded run on a mesh
that keeps the case's tensor-parallel split and drops only its data-parallel sharding: one rank
without TP; the TP ranks of the first data-parallel slice (``twin_ranks``) under TP, on a
``dp1xtp<T>`` mesh of groups of those ranks alone (``use_local_synchronization``: no other
rank takes part). Each step runs every data-parallel slice of the global batch as a
micro-batch -- its own forward, its own loss (that slice's local mean), its own backward, so
every activation and gradient is quantized as that slice's ranks quantize it (and under TP
every row-parallel partial sum is the one the sharded run makes) -- accumulates the gradients
and divides them by the number of slices, as FSDP2's reduce-scatter averages them. What is
left to differ from the sharded run is the order of the data-parallel reduction: over two
slices ``a + b`` either way, so the twin is bit-exact there where measured so
(calibration/twin.py); elsewhere the check takes a calibrated tolerance.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from harness.distributed import data, parallel, run
from harness.spec.mesh import SHARD, TP, MeshSpec, parse_mesh

SPEC = MeshSpec("dp1")  # one FSDP2 shard of size 1: the whole model on this rank
_MESHES: dict = {}
LOCAL_BACKEND = "gloo"  # the twin's groups': no split of the launch's NCCL communicator


def twin_spec(spec: MeshSpec) -> MeshSpec:
    """The twin's mesh: the case's TP degree, one data-parallel rank."""
    return SPEC if spec.tp == 1 else parse_mesh(f"dp1xtp{spec.tp}")


def twin_ranks(spec: MeshSpec) -> list[int]:
    """The ranks that compute the twin: those of the first data-parallel slice (rank 0 and,
    under TP, its TP peers)."""
    return [r for r in range(spec.world_size) if spec.dp_index(r) == 0]


def singleton_mesh(device_type: str, names: dict | None = None) -> DeviceMesh:
    """A 1-D, one-rank device mesh of this rank (its dim named as the backend names SHARD);
    one per process and dim name (process groups are costly).

    Its group is gloo, whatever the launch's backend: rank 0 makes it alone, and a new NCCL
    group under an eagerly initialized default group (``device_id`` bound, as the worker's
    NCCL launches are) is an ``ncclCommSplit`` of the default communicator, which every rank
    of the launch must call -- rank 0 alone would wait there for good. On one rank a
    collective is a copy, so the twin's values do not depend on the group's backend; gloo runs
    FSDP2's collectives on CUDA tensors (ranks sharing a GPU use nothing else)."""
    name = (names or {}).get(SHARD, SHARD)
    if (device_type, name) not in _MESHES:
        group = dist.new_group([dist.get_rank()], backend=LOCAL_BACKEND,
                               use_local_synchronization=True)
        _MESHES[(device_type, name)] = DeviceMesh.from_group(group, device_type,
                                                             mesh_dim_names=(name,))
    return _MESHES[(device_type, name)]


def tp_twin_mesh(device_type: str, ranks: list[int], names: dict | None,
                 timeout: timedelta) -> DeviceMesh:
    """The 2-D (one-rank shard dim x TP over ``ranks``) mesh of the TP twin, made by ``ranks``
    alone (gloo, as ``singleton_mesh`` says why); one per process, dims and ranks. Its
    collectives are bounded by ``timeout``."""
    names = names or {}
    dims = (names.get(SHARD, SHARD), names.get(TP, TP))
    key = (device_type, dims, tuple(ranks))
    if key not in _MESHES:
        shard = singleton_mesh(device_type, names).get_group()
        tp = twin_tp_group(ranks, timeout)
        _MESHES[key] = DeviceMesh.from_group([shard, tp], device_type, mesh=[list(ranks)],
                                             mesh_dim_names=dims)
    return _MESHES[key]


def twin_tp_group(ranks, timeout: timedelta):
    """The TP twin's gloo group over ``ranks``, made by EVERY rank of the launch (plain
    ``new_group``: its name is the world's group count, the same on every rank). Not
    ``use_local_synchronization``: that names the group sha1(ranks + this process's number of
    groups), which differs between twin ranks once an earlier twin of fewer ranks (dp3xtp2's
    [0, 1] before dp2xtp3's [0, 1, 2]) made groups on some of them -- each then waits out the
    group's timeout in the gloo rendezvous, under a prefix its peers never write."""
    key = ("tp_group", tuple(ranks))
    if key not in _MESHES:
        _MESHES[key] = dist.new_group(list(ranks), backend=LOCAL_BACKEND, timeout=timeout)
    return _MESHES[key]


def prepare(case) -> None:
    """Every rank, before any unit (worker/runner.py, where the phase runs the twin): the TP
    twin's group of ``case`` (a collective over the world: a rank whose unit raised would
    never join it)."""
    if case.mesh.tp > 1:
        twin_tp_group(twin_ranks(case.mesh), timedelta(seconds=case.timeout_s))


def _local(t):
    return t._local_tensor if isinstance(t, DTensor) else t


def _quantized(t) -> bool:
    """A quantized tensor (``run.is_quantized``: a plain ``nn.Parameter`` -- the block formats'
    twin has no FSDP -- is none, though it has ``dequantize``)."""
    return run.is_quantized(_local(t))


def _whole(t) -> torch.Tensor:
    """A tensor of the twin's model as a plain fp32 CPU tensor (quantized: dequantized): a
    DTensor gathered over the twin's mesh (collective over the twin's ranks; under TP its
    TP shards), a plain tensor as this rank holds it (as ``Run`` reads one)."""
    local = (_local(t).dequantize() if _quantized(t) else _local(t)).detach().cpu()
    if isinstance(t, DTensor):  # plain gloo gathers: on torch 2.11 + CUDA, DTensor's
        mesh = t.device_mesh    # functional all-gather over these groups crashed (SIGSEGV)
        for dim, placement in enumerate(t.placements):
            if mesh.size(dim) == 1 or placement.is_replicate():
                continue
            if not placement.is_shard() or type(placement).__name__ != "Shard":
                raise ValueError(f"the twin cannot gather a {placement} over its mesh dim {dim}")
            parts = [None] * mesh.size(dim)
            dist.all_gather_object(parts, local, group=mesh.get_group(dim))
            local = torch.cat(parts, dim=placement.dim)
    return local.to(torch.float32).clone()


def twin_mesh(case, backend, device_type: str) -> tuple[DeviceMesh, MeshSpec]:
    """The twin's mesh and spec for ``case`` (collective over ``twin_ranks``)."""
    spec = twin_spec(case.mesh)
    if spec.tp == 1:
        return singleton_mesh(device_type, backend.mesh_names(case)), spec
    timeout = timedelta(seconds=case.timeout_s)
    return tp_twin_mesh(device_type, twin_ranks(case.mesh), backend.mesh_names(case),
                        timeout), spec


def single_rank_run(case, backend, device, device_type: str) -> tuple:
    """(losses, first-step grads, final params, final stored params or None) of the twin of
    ``case`` (one slice per data-parallel rank), run by every rank of ``twin_ranks`` (the
    values: rank 0's): ``params`` the optimizer's fp32 master weight where it keeps one for a
    quantized parameter, else the parameter; ``stored`` every parameter as the model computes
    with it (quantized ones dequantized; only where some parameter is quantized); canonical
    names, as ``Run``."""
    spec = case.mesh
    # one representative rank per data-parallel slice (TP ranks of a slice share its batch)
    slices = {spec.dp_index(r): r for r in reversed(range(spec.world_size))}
    mesh, tspec = twin_mesh(case, backend, device_type)
    group = parallel.mesh_group(mesh)
    # a recipe whose scales come from the amax over the whole data-parallel group (TE
    # DelayedScaling reduces its amaxes over the world each step): its amaxes reduced over the
    # twin's ranks alone, its histories advanced once a step (``one_update_per_step``) -- each
    # slice still a micro-batch of its own, so that its GEMMs are its ranks' (the whole batch in
    # one forward made other shapes, whose fp32 differences flipped FP8 roundings)
    runs = [(spec, rank) for _, rank in sorted(slices.items())]
    autocast = dict(group=group) if backend.twin_amax_group(case) else {}
    model = backend.build_twin(case, mesh, tspec, case.train.seed, device)
    optim = backend.optimizer(model, case)
    names = backend.canonical_names(model)
    losses, grads = [], None
    for step in range(case.train.steps):
        step_losses = []  # per slice, summed as the sharded run's
        with backend.one_update_per_step(case) as held:  # amax histories: once per step
            for run_spec, rank in runs:
                held.next_slice()
                x, y = data.local_batch(case.task, case.model, case.train.seed, step, run_spec,
                                        rank, device)
                with backend.autocast(case, **autocast):
                    out = model(x)
                loss = data.TASKS[case.task].loss(out, y)
                loss.backward()
                step_losses.append(loss.detach().to("cpu", torch.float32))
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(len(slices))
        if step == 0:
            grads = {names.get(n, n): _whole(p.grad) for n, p in model.named_parameters()
                     if p.grad is not None}
        optim.step()
        optim.zero_grad(set_to_none=True)
        losses.append(run.slices_mean(step_losses))
    params, stored, quantized = {}, {}, False
    for n, p in model.named_parameters():
        master = optim.state.get(p, {}).get("master_param") if _quantized(p) else None
        stored[names.get(n, n)] = _whole(p)  # one gather a tensor: params reuse it
        params[names.get(n, n)] = _whole(master) if isinstance(master, torch.Tensor) \
            else stored[names.get(n, n)]
        quantized = quantized or _quantized(p)
    return losses, grads, params, (stored if quantized else None)
