"""The artifacts a case's checks need, each made by one producer (collective over the world).

train phase (the case's mesh)::

    train      -> trained      build, train ``train.steps`` steps (loss trace)
    reference  -> reference    the single-process FP32 run (only when a check needs it)
    single_rank -> single_rank the one-rank twin of the case's own recipe (sharding invariance)
    export     -> exported     the FP32 safetensors file users ship (only when checked)
    save       -> checkpoint,  capture *S*, save with the case's DCP mode (async: the next
                  continued    step mutates the live state while the save is in flight)
    load       -> loaded       a fresh model + optimizer on the same mesh, loaded

reshard phase (the target mesh)::

    expected      -> expected   *S* and the uninterrupted next step, written by ``save``
    reshard_load  -> resharded  a fresh model + optimizer on the target mesh, loaded

A producer that loads a checkpoint calls ``art.load_fn`` (``checkpoint.load`` unless a
registry entry's workaround replaced it, see ``harness/worker/workarounds.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from harness.distributed import checkpoint, faults
from harness.distributed.gather import on_rank0
from harness.distributed.run import Run, reference_run
from harness.spec import catalog
from harness.worker import ckpt_faults

EXPECTED = "expected.pt"  # written by the train phase's save for the reshard phase
TRAIN_MISSING = "train_missing.json"  # the train phase's missing artifacts and why


class NotRunnable(Exception):
    """A producer cannot run for a reason that is no failure of its own (e.g. the train phase
    made no checkpoint for the reshard phase): the runner records it as not run."""


@dataclass
class Trained:
    run: Run
    losses: list
    grads0: dict  # first-step gradients, canonical names
    initial: dict  # parameters at init, canonical names


@dataclass
class Reference:
    losses: list
    grads: dict
    initial: dict
    params: dict


@dataclass
class SingleRank:
    losses: list
    grads: dict
    params: dict  # fp32 master weights where the optimizer keeps them
    stored: dict | None  # every parameter as the model computes with it (quantized recipes)


@dataclass
class Exported:
    path: Any  # the safetensors file
    quantized: dict  # name -> dequantized quantized weight the model computes with


@dataclass
class Saved:
    main: Any  # Path of the case-mode checkpoint
    twin: Any  # Path of a sync checkpoint of the same state (async modes), else None
    state: dict  # S: full state captured right before the save (what every load must give)


@dataclass
class Continued:
    loss: float  # the uninterrupted run's next step
    params: dict
    state: dict | None  # full state after that step (backends with lazily rebuilt buffers)


@dataclass
class Expected:
    state: dict
    next_loss: float
    next_params: dict


@dataclass(frozen=True)
class Producer:
    name: str
    needs: tuple[str, ...]
    makes: tuple[str, ...]
    fn: Callable  # fn(art) -> {artifact: value}
    phase: str
    loads: bool = False  # loads a checkpoint (a workaround may replace the load)


def case_notes(art) -> None:
    """The train unit's notes of what the backend does for the case (its workarounds)."""
    ctx, case = art.ctx, art.case
    for name, what in ctx.backend.applied_workarounds(case).items():
        art.rec.note("train", f"workaround:{name}", f"the {ctx.backend.name} backend applies "
                                                    f"workaround {name}: {what}")
    for name, what in ctx.backend.case_notes(case).items():
        art.rec.note("train", name, what)


def train(art) -> dict:
    ctx, case = art.ctx, art.case
    case_notes(art)
    run = Run(ctx, case, case.mesh, seed=case.train.seed)
    faults.after_build(case, run)
    initial = run.full_params()
    losses, grads0 = [], None
    for step in range(case.train.steps):
        loss, g = run.step(step, capture_grads=(step == 0))
        losses.append(loss)
        grads0 = g if g is not None else grads0
    faults.after_train(case, run)
    art.rec.trace("loss", losses)
    return {"trained": Trained(run, losses, grads0, initial)}


def reference(art) -> dict:
    """The single-process FP32 run; one per run for everything that determines it (cached in
    the run's work directory, speed/reference_cache.py)."""
    from harness.speed import reference_cache
    case, ctx = art.case, art.ctx
    scale = faults.reference_lr_scale(case)
    k = reference_cache.key(case, ctx.backend, ctx.device, scale)
    losses, grads, initial, params = reference_cache.cached(
        art.ckpt.parent / "reference_cache", k,
        lambda: reference_run(case, ctx.backend, case.train.steps, ctx.device, lr_scale=scale),
        ctx)
    return {"reference": Reference(losses, grads, initial, params)}


def single_rank(art) -> dict:
    """The one-rank twin (distributed/single.py), computed by rank 0 once per run for
    everything that determines it, like the FP32 reference; not run where it cannot stand
    for the case (calibration/twin.py says why)."""
    from harness.calibration.twin import not_applicable
    from harness.distributed.single import single_rank_run, twin_ranks
    from harness.speed import reference_cache
    case, ctx = art.case, art.ctx
    why = not_applicable(case, ctx.backend.name, ctx.device_type)
    if why:
        raise NotRunnable(why)
    k = reference_cache.key(case, ctx.backend, ctx.device, 1.0, twin=True)
    losses, grads, params, stored = reference_cache.cached(
        art.ckpt.parent / "reference_cache", k,
        lambda: single_rank_run(case, ctx.backend, ctx.device, ctx.device_type), ctx,
        ranks=tuple(twin_ranks(case.mesh)))
    return {"single_rank": SingleRank(losses, grads, params, stored)}


def export(art) -> dict:
    """The FP32 safetensors export users ship: a quantized parameter's fp32 master weight where
    the optimizer keeps one, else the parameter as fp32 -- never a full-precision parameter's
    master, which an optimizer may keep stale (``Run.truth``); rank 0 writes, every rank
    gathers. Also the quantized weights the model computes with, for the check."""
    from safetensors.torch import save_file

    from harness.distributed.run import flatten, is_quantized
    run = art["trained"].run
    sources, quantized = {}, {}
    for name, p in run.model.named_parameters():
        sources[name] = run.truth(p)
        if is_quantized(getattr(p, "_local_tensor", p)):
            quantized[name] = p
    # one gather for the whole export and one for the quantized weights (not one per tensor)
    flat = flatten(sources, raw=False)
    export = {n: flat[n].to(torch.float32).contiguous() for n in sources}
    quantized = flatten(quantized, raw=False)
    faults.in_export(art.case, export)
    path = art.ckpt / "model.safetensors"
    on_rank0(art.ctx, lambda: save_file(export, str(path)))
    return {"exported": Exported(path, quantized)}


def save(art, sync_twin=None) -> dict:
    """``sync_twin``: a sync checkpoint of this very state *S* another case saved (a DCP mode
    of its group, worker/mode_group.py), in place of saving one."""
    ctx, case, t = art.ctx, art.case, art["trained"]
    run, mode = t.run, case.ax["dcp"]
    main = art.ckpt / "main"
    twin = art.ckpt / "sync_twin" if "async_equivalence" in case.checks else None
    state = run.full_state()  # S: what every load must reproduce bit for bit
    if twin is not None:
        if sync_twin is None:
            checkpoint.save(run, twin, "sync")
        twin = sync_twin or twin
        faults.before_async_save(case, run)
    fault = faults.fault_of(case)
    pending = checkpoint.save(run, main, mode, async_group=ctx.async_group,
                              storage_writer=ckpt_faults.storage_writer(fault, mode, main,
                                                                        ctx.rank))
    # The uninterrupted run goes on at once: for async saves this mutates parameters and
    # optimizer state in place while the checkpoint is being written.
    next_loss, _ = run.step(case.train.steps)
    checkpoint.wait(pending, timeout_s=case.timeout_s / 2)
    ckpt_faults.after_save(fault, main, ctx.rank)
    dist.barrier()
    next_params = run.full_params()
    next_state = run.full_state() if ctx.backend.lazy_buffers else None
    if art.for_reshard:  # a reshard phase loads this checkpoint
        on_rank0(ctx, lambda: torch.save(
            {"state": state, "next_loss": next_loss, "next_params": next_params},
            art.ckpt / EXPECTED))
    return {"checkpoint": Saved(main, twin, state),
            "continued": Continued(next_loss, next_params, next_state)}


def load(art) -> dict:
    case = art.case
    fresh = Run(art.ctx, case, case.mesh, seed=case.train.seed + 1)
    _load(art, fresh, art["checkpoint"].main)
    return {"loaded": fresh}


def expected(art) -> dict:
    path = art.ckpt / EXPECTED
    missing = art.ckpt / TRAIN_MISSING
    if not path.is_file() and missing.is_file():
        why = json.loads(missing.read_text()).get("checkpoint")
        if why:
            raise NotRunnable(f"needs the train phase's checkpoint, which {why}")
    if not path.is_file() or not checkpoint.is_complete(art.ckpt / "main"):
        raise RuntimeError(f"the train phase left no complete checkpoint in {art.ckpt}")
    e = torch.load(path, weights_only=True)
    return {"expected": Expected(e["state"], e["next_loss"], e["next_params"])}


def reshard_load(art) -> dict:
    case = art.case
    run = Run(art.ctx, case, case.target, seed=case.train.seed + 2)
    _load(art, run, art.ckpt / "main")
    return {"resharded": run}


def _load(art, run: Run, path) -> None:
    if not faults.skip_load(art.case):
        art.load_fn(run, path)
    faults.after_load(art.case, run, run.ctx.rank)


PRODUCERS = (
    Producer("train", (), ("trained",), train, "train"),
    Producer("reference", (), ("reference",), reference, "train"),
    Producer("single_rank", (), ("single_rank",), single_rank, "train"),
    Producer("export", ("trained",), ("exported",), export, "train"),
    Producer("save", ("trained",), ("checkpoint", "continued"), save, "train"),
    Producer("load", ("checkpoint",), ("loaded",), load, "train", loads=True),
    Producer("expected", (), ("expected",), expected, "reshard"),
    Producer("reshard_load", ("expected",), ("resharded",), reshard_load, "reshard", loads=True),
)
NAMES = tuple(p.name for p in PRODUCERS)
assert NAMES == tuple(catalog.PRODUCERS), "catalog.PRODUCERS lists the producers in order"
