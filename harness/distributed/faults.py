"""Fault injection for the harness's negative controls (catalog.FAULTS).

A check that cannot fail proves nothing: tests run cases with these faults and assert that
the matching check fails (or that the case errors / times out) and the next case passes.
"""

from __future__ import annotations

import os
import time

import torch


def fault_of(case) -> str:
    return case.ax.get("fault", "none")


def at_case_start(case, rank: int) -> None:
    fault = fault_of(case)
    if fault == "hang" and rank == 1:
        time.sleep(10_000)
    if fault == "crash" and rank == 1:
        os._exit(3)


def before_unit(case, unit: str, rank: int) -> None:
    """Called by the runner before each producer / check of the case."""
    fault = fault_of(case)
    if fault == "raise" and unit == "train" and rank == 0:
        raise RuntimeError("injected fault: rank 0 raises")
    if fault == "check_raises" and unit == "fp32_parity":
        raise RuntimeError("injected fault: fp32_parity raises on every rank")


def skip_load(case) -> bool:
    return fault_of(case) == "skip_load"


def reference_lr_scale(case) -> float:
    return 1.01 if fault_of(case) == "perturb_reference" else 1.0


def reduce_dtype(case, mesh_spec) -> torch.dtype | None:
    """Sized bug ``grads_bf16_before_reduce``, distributed-only: FSDP2 reduces the gradients
    in bf16 (cast on their way into the reduce-scatter) on a mesh of more than one
    data-parallel rank; the twin, which reduces over no data-parallel ranks, keeps its policy's
    dtype."""
    if fault_of(case) == "grads_bf16_before_reduce" and mesh_spec.dp_size > 1:
        return torch.bfloat16
    return None


def run_lr_scale(case) -> float:
    """Sized bug: the run under test steps with this multiple of the reference's learning
    rate (``lr_scale_1.5`` / ``lr_scale_0.67``)."""
    f = fault_of(case)
    return float(f.removeprefix("lr_scale_")) if f.startswith("lr_scale_") else 1.0


@torch.no_grad()
def after_build(case, run) -> None:
    """Sized bug ``wrong_scale``: the first weight of the run under test reads twice its value
    -- a quantized weight's scale_inv doubled (re-quantized at 2x), a plain weight doubled.
    Sized bug ``frozen_weights``: the optimizer skips every weight matrix (their gradients are
    dropped right before each step, after the first step's were captured).
    Sized bug ``grads_bf16``, distributed-only: the reduced gradients are rounded to bf16 right
    after each backward, as a gradient reduction in bf16 leaves a policy's fp32 gradients --
    before anything reads them (the first-step gradients the checks compare, the step)."""
    if fault_of(case) == "frozen_weights":
        _freeze_weights(run.optim)
    if fault_of(case) == "grads_bf16":
        run.after_backward.append(_round_grads_bf16)
    if fault_of(case) != "wrong_scale":
        return
    for _, p in run.model.named_parameters():
        if p.dim() < 2:
            continue
        local = getattr(p, "_local_tensor", p)
        if type(local) is not torch.Tensor and hasattr(local, "dequantize"):
            local.copy_(local.dequantize() * 2)
        else:
            local.mul_(2)
        return


@torch.no_grad()
def after_load(case, run, rank: int) -> None:
    model = run.model
    if fault_of(case) == "drop_columnwise_on_load":
        _drop_columnwise(model)
    if fault_of(case) == "untie_on_load":
        _untie(model)
    if fault_of(case) == "drop_exp_avg":
        _zero_exp_avg(run.optim)
    if fault_of(case) == "grads_bf16":  # the loaded run has the same distributed path
        run.after_backward.append(_round_grads_bf16)
    if fault_of(case) != "perturb_loaded" or rank != 0:
        return
    p = next(iter(model.parameters()))
    local = p.to_local() if hasattr(p, "to_local") else p
    if local.numel():
        local.view(-1)[0] += 1e-3


def _before_each_step(optim, action) -> None:
    """Run ``action(params)`` (the optimizer's parameters) before every ``optim.step``."""
    params = [p for g in optim.param_groups for p in g["params"]]
    step = optim.step

    def faulty_step(*args, **kwargs):
        with torch.no_grad():
            action(params)
        return step(*args, **kwargs)
    optim.step = faulty_step


def _freeze_weights(optim) -> None:
    def drop_weight_grads(params):
        for p in params:
            if p.dim() >= 2:
                p.grad = None  # optimizers skip a parameter without a gradient
    _before_each_step(optim, drop_weight_grads)


@torch.no_grad()
def _round_grads_bf16(model) -> None:
    for p in model.parameters():
        if p.grad is not None:
            g = getattr(p.grad, "_local_tensor", p.grad)
            g.copy_(g.to(torch.bfloat16).to(g.dtype))


def _drop_columnwise(model) -> None:
    """Lose the columnwise copy of the first quantized weight that has one (every rank):
    what a load that restores only rowwise data would leave behind."""
    for _, p in model.named_parameters():
        local = getattr(p, "_local_tensor", p)  # to_local() would return an alias
        parts = getattr(local, "_parts", None)
        cols = [k for k in (parts or {}) if k.startswith("col")]
        if cols:
            for k in cols:
                del parts[k]
            return
    raise RuntimeError("drop_columnwise_on_load: no quantized weight with columnwise data")


def _untie(model) -> None:
    """Every later alias of a tied parameter becomes a copy of its own (every rank): what a
    load that assigns tensors instead of copying into them leaves behind."""
    from torch import nn

    from harness.distributed.parallel import tied_groups
    groups = tied_groups(model)
    if not groups:
        raise RuntimeError("untie_on_load: the model has no tied parameters")
    for first, *aliases in groups:
        p = model.get_parameter(first)
        for name in aliases:
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr,
                    nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad))


def _zero_exp_avg(optim) -> None:
    """Sized bug ``drop_exp_avg``: the loaded optimizer lost the first moment of its largest
    parameter (every rank)."""
    states = [st for st in optim.state.values() if "exp_avg" in st]
    if not states:
        raise RuntimeError("drop_exp_avg: the optimizer holds no exp_avg after the load")
    st = max(states, key=lambda st: st["exp_avg"].numel())
    t = st["exp_avg"]
    getattr(t, "_local_tensor", t).zero_()


@torch.no_grad()
def after_train(case, run) -> None:
    """Fault ``diverge_replica``: the last rank adds 1e-3 to the first element of the first
    parameter it holds a replica of (HSDP replicate dim, TP-replicated norms / biases). Fault
    ``stale_master``: every master weight of the optimizer is 1.01x the weight the model
    computes with (every rank)."""
    if fault_of(case) == "stale_master":
        masters = [m for st in run.optim.state.values()
                   if isinstance(m := st.get("master_param"), torch.Tensor)]
        if not masters:  # an injected bug that changes nothing must not pass as caught-nothing
            raise RuntimeError("stale_master: the optimizer keeps no master weights here "
                               "(plain params, or a recipe without them)")
        for m in masters:
            getattr(m, "_local_tensor", m).mul_(1.01)
    if fault_of(case) != "diverge_replica":
        return
    from torch.distributed.tensor import DTensor, Replicate
    for _, p in run.model.named_parameters():
        if isinstance(p, DTensor) and any(isinstance(pl, Replicate) for pl in p.placements):
            if run.ctx.rank == run.ctx.world_size - 1 and p._local_tensor.numel():
                p._local_tensor.view(-1)[0] += 1e-3
            return
    raise RuntimeError("diverge_replica: no parameter has a replicated placement on this mesh")


def in_export(case, export: dict) -> None:
    """Faults ``export_nan`` / ``export_wrong``: the exporter corrupts its first tensor."""
    f = fault_of(case)
    if f not in ("export_nan", "export_wrong"):
        return
    name = next(iter(export))
    t = export[name]
    if f == "export_nan":
        t.view(-1)[0] = float("nan")
    else:
        t.mul_(1.01)


@torch.no_grad()
def before_async_save(case, run) -> None:
    """Fault ``async_differs``: one element of the first parameter changes between the sync
    twin and the async save, so the async checkpoint holds other bytes."""
    if fault_of(case) != "async_differs":
        return
    p = next(iter(run.model.parameters()))
    local = getattr(p, "_local_tensor", p)
    if local.numel():
        local.view(-1)[0] += 1e-3


@torch.no_grad()
def after_restore(case, run) -> None:
    """Fault ``restore_drift``: the trained run a further DCP mode starts from (the
    ``mode_group`` layer) comes back with the first element of rank 0's first parameter one
    ulp up -- the smallest restore that is not the trained state."""
    if fault_of(case) != "restore_drift" or run.ctx.rank != 0:
        return
    p = next(iter(run.model.parameters()))
    local = getattr(p, "_local_tensor", p)
    if local.numel() and local.dtype.is_floating_point:
        x = local.view(-1)[:1]
        x.copy_(torch.nextafter(x, torch.full_like(x, float("inf"))))
