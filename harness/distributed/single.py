"""The sharding-invariance twin: the case's own recipe and module on ONE rank.

Same backend, build, optimizer, autocast, seed, data and steps as the sharded run, on a one-rank
device mesh of this process (a process group of this rank alone, ``use_local_synchronization``:
no other rank takes part). Each step runs every data-parallel rank's slice of the global batch
as a micro-batch -- its own forward, its own loss (that rank's local mean), its own backward, so
every activation and gradient is quantized as that rank quantizes it -- accumulates the
gradients and divides them by the number of slices, as FSDP2's reduce-scatter averages them.
What is left to differ from the sharded run is the order of the reductions: over two slices
without TP ``a + b`` either way, so the twin is bit-exact there (measured,
calibration/twin.py); elsewhere the check takes a calibrated tolerance.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from harness.distributed import data
from harness.spec.mesh import SHARD, MeshSpec

SPEC = MeshSpec("dp1")  # one FSDP2 shard of size 1: the whole model on this rank
_MESHES: dict = {}
LOCAL_BACKEND = "gloo"  # the one-rank group's: no split of the launch's NCCL communicator


def singleton_mesh(device_type: str, names: dict | None = None) -> DeviceMesh:
    """A 1-D, one-rank device mesh of this rank (its dim named as the backend names SHARD);
    one per process and dim name (process groups are costly).

    Its group is gloo, whatever the launch's backend: rank 0 makes it alone (the twin is
    computed once, on rank 0), and a new NCCL group under an eagerly initialized default group
    (``device_id`` bound, as the worker's NCCL launches are) is an ``ncclCommSplit`` of the
    default communicator, which every rank of the launch must call -- rank 0 alone would wait
    there for good. On one rank a collective is a
    copy, so the twin's values do not depend on the group's backend; gloo runs FSDP2's
    collectives on CUDA tensors (ranks sharing a GPU use nothing else)."""
    name = (names or {}).get(SHARD, SHARD)
    if (device_type, name) not in _MESHES:
        group = dist.new_group([dist.get_rank()], backend=LOCAL_BACKEND,
                               use_local_synchronization=True)
        _MESHES[(device_type, name)] = DeviceMesh.from_group(group, device_type,
                                                             mesh_dim_names=(name,))
    return _MESHES[(device_type, name)]


def _local(t):
    return t._local_tensor if isinstance(t, DTensor) else t


def _quantized(t) -> bool:
    return type(_local(t)) is not torch.Tensor and hasattr(_local(t), "dequantize")


def _whole(t) -> torch.Tensor:
    """A tensor of the one-rank model as a plain fp32 CPU tensor (quantized: dequantized); on a
    one-rank mesh the local tensor is the whole tensor."""
    local = _local(t).dequantize() if _quantized(t) else _local(t)
    return local.detach().to("cpu", torch.float32).clone()


def single_rank_run(case, backend, device, device_type: str) -> tuple:
    """(losses, first-step grads, final params, final stored params or None) of the twin of
    ``case`` (FSDP / HSDP meshes: one slice per data-parallel rank): ``params`` the
    optimizer's fp32 master weight where it keeps one for a quantized parameter, else the
    parameter; ``stored`` every parameter as the model computes with it (quantized ones
    dequantized; only where some parameter is quantized); canonical names, as ``Run``."""
    spec = case.mesh
    # one rank per data-parallel slice (TP ranks of a slice share its batch)
    slices = {spec.dp_index(r): r for r in reversed(range(spec.world_size))}
    mesh = singleton_mesh(device_type, backend.mesh_names(case))
    # a recipe whose scales come from the amax over the whole data-parallel group (TE
    # DelayedScaling reduces its amaxes over the world each step; micro-batches would advance
    # its amax histories once per slice): one forward over the whole global batch, its loss
    # scaled so that every gradient the backward makes has the size a rank's has (the sum of
    # the slices' mean losses)
    whole = backend.twin_whole_batch(case)
    runs = [(None, 0)] if whole else [(spec, rank) for _, rank in sorted(slices.items())]
    scale = float(len(slices)) if whole else 1.0
    autocast = dict(group=mesh.get_group()) if whole else {}  # its amaxes: this rank's alone
    model = backend.build(case, mesh, SPEC, case.train.seed, device)
    optim = backend.optimizer(model, case)
    names = backend.canonical_names(model)
    losses, grads = [], None
    for step in range(case.train.steps):
        total = torch.zeros((), dtype=torch.float32)  # as the sharded run's all_reduce sums
        with backend.one_update_per_step(case) as held:  # amax histories: once per step
            for run_spec, rank in runs:
                held.next_slice()
                x, y = data.local_batch(case.task, case.model, case.train.seed, step, run_spec,
                                        rank, device)
                with backend.autocast(case, **autocast):
                    out = model(x)
                loss = data.TASKS[case.task].loss(out, y)
                (loss * scale if whole else loss).backward()
                total += loss.detach().to("cpu", torch.float32) * scale
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(len(slices))
        if step == 0:
            grads = {names.get(n, n): _whole(p.grad) for n, p in model.named_parameters()
                     if p.grad is not None}
        optim.step()
        optim.zero_grad(set_to_none=True)
        losses.append(float(total) / len(slices))
    params, stored, quantized = {}, {}, False
    for n, p in model.named_parameters():
        master = optim.state.get(p, {}).get("master_param") if _quantized(p) else None
        params[names.get(n, n)] = _whole(master if isinstance(master, torch.Tensor) else p)
        stored[names.get(n, n)] = _whole(p)
        quantized = quantized or _quantized(p)
    return losses, grads, params, (stored if quantized else None)
