"""What one case does on one rank, in two phases.

``train`` (world of the case's mesh): train N steps -> fp32_parity; capture the full state S;
save with the case's DCP mode (async: the next training step mutates the live state while the
save is in flight) -> async_equivalence; load into a fresh model on the same mesh ->
dcp_roundtrip; keep S and the uninterrupted next step for the reshard phase.

``reshard`` (world of the target mesh): load the checkpoint into a fresh model on the target
mesh -> reshard (state bitwise vs S, next step within tolerance of the uninterrupted one).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist

from .. import tolerances
from ..checks.record import Recorder
from . import checkpoint, faults
from .run import Run, mesh_independent, reference_run

EXPECTED = "expected.pt"  # written by the train phase for the reshard phase


def _tol(case, check, quantity, scale=None):
    return tolerances.lookup(check, quantity, case.recipe, case.tolerances, scale)


def _losses(values) -> dict:
    return {"loss": torch.tensor(values, dtype=torch.float64)}


def train(ctx, case, ckpt: Path, rec: Recorder) -> None:
    steps = case.train.steps
    with rec.section("train"):
        run = Run(ctx, case, case.mesh, seed=case.train.seed)
        initial = run.full_params()
        scale = tolerances.ParamScale.measure(initial)  # parameter tolerances scale with it
        losses, grads0 = [], None
        for step in range(steps):
            loss, g = run.step(step, capture_grads=(step == 0))
            losses.append(loss)
            grads0 = g if g is not None else grads0
    rec.trace("loss", losses)

    if "fp32_parity" in case.checks:
        with rec.section("fp32_parity"):
            ref_losses, ref_grads, ref_params = reference_run(
                case, ctx.backend, steps, ctx.device, lr_scale=faults.reference_lr_scale(case))
            rec.compare("fp32_parity", "loss", _losses(losses), _losses(ref_losses),
                        _tol(case, "fp32_parity", "loss"))
            rec.compare("fp32_parity", "grads", grads0, ref_grads,
                        _tol(case, "fp32_parity", "grads"))
            final = run.full_params()
            rec.compare("fp32_parity", "params", final, ref_params,
                        _tol(case, "fp32_parity", "params", scale))
            # An optimizer that silently skips a parameter can stay inside the tolerance for a
            # few steps; every parameter with a gradient must have moved.
            frozen = [n for n, g in grads0.items()
                      if n in final and bool(g.abs().max() > 0) and torch.equal(final[n], initial[n])]
            rec.flag("fp32_parity", "params_updated", not frozen,
                     f"{len(frozen)} parameters did not move during training: {', '.join(frozen[:6])}"
                     if frozen else "every parameter with a gradient moved")
    for name, check in ctx.backend.checks(case).items():
        if name in case.checks:
            with rec.section(name):
                check(run, rec)

    mode = case.ax["dcp"]
    main, twin = ckpt / "main", ckpt / "sync_twin"
    check_async = "async_equivalence" in case.checks
    with rec.section("async_equivalence" if check_async else "dcp_roundtrip"):
        saved = run.full_state()  # S: what every load must reproduce bit for bit
        if check_async:
            checkpoint.save(run, twin, "sync")
        handle = checkpoint.save(run, main, mode, async_group=ctx.async_group)
        # The uninterrupted run goes on at once: for async saves this mutates parameters and
        # optimizer state in place while the checkpoint is being written.
        next_loss, _ = run.step(steps)
        checkpoint.wait(handle, timeout_s=case.timeout_s)
        dist.barrier()
        next_params = run.full_params()

    if check_async:
        def compare_files():
            async_content = checkpoint.read_full(main)
            rec.compare("async_equivalence", "bytes", async_content, checkpoint.read_full(twin),
                        tolerances.BITWISE)
            rec.compare("async_equivalence", "isolation", async_content, mesh_independent(saved),
                        tolerances.BITWISE)
        with rec.section("async_equivalence"):
            _on_rank0(ctx, compare_files)

    if "dcp_roundtrip" in case.checks:
        with rec.section("dcp_roundtrip"):
            fresh = Run(ctx, case, case.mesh, seed=case.train.seed + 1)
            _load(case, fresh, main)
            rec.compare("dcp_roundtrip", "state", fresh.full_state(), saved, tolerances.BITWISE)
            loss2, _ = fresh.step(steps)
            rec.compare("dcp_roundtrip", "next_loss", _losses([loss2]), _losses([next_loss]),
                        tolerances.BITWISE)
            rec.compare("dcp_roundtrip", "next_params", fresh.full_params(), next_params,
                        tolerances.BITWISE)

    if case.target is not None:
        _on_rank0(ctx, lambda: torch.save(
            {"state": saved, "next_loss": next_loss, "next_params": next_params,
             "scale": dataclasses.astuple(scale)}, ckpt / EXPECTED))


def _on_rank0(ctx, fn) -> None:
    """Run ``fn`` on rank 0 only; if it raises, every rank raises (no rank is left waiting in
    a collective the others never reach)."""
    err = None
    if ctx.rank == 0:
        try:
            fn()
        except Exception as e:  # re-raised below, on every rank
            err = e
    flag = [repr(err) if err else None]
    dist.broadcast_object_list(flag, src=0, group=ctx.control)
    if err is not None:
        raise err
    if flag[0] is not None:
        raise RuntimeError(f"rank 0 failed: {flag[0]}")


def _load(case, run: Run, path: Path) -> None:
    if not faults.skip_load(case):
        checkpoint.load(run, path)
    faults.after_load(case, run.model, run.ctx.rank)


def reshard(ctx, case, ckpt: Path, rec: Recorder) -> None:
    with rec.section("reshard"):
        _reshard(ctx, case, ckpt, rec)


def _reshard(ctx, case, ckpt: Path, rec: Recorder) -> None:
    expected_path = ckpt / EXPECTED
    if not expected_path.is_file() or not checkpoint.is_complete(ckpt / "main"):
        raise RuntimeError(f"the train phase left no complete checkpoint in {ckpt}")
    expected = torch.load(expected_path, weights_only=True)
    run = Run(ctx, case, case.target, seed=case.train.seed + 2)
    _load(case, run, ckpt / "main")
    rec.compare("reshard", "state", mesh_independent(run.full_state()),
                mesh_independent(expected["state"]), tolerances.BITWISE)
    loss, _ = run.step(case.train.steps)
    rec.compare("reshard", "next_loss", _losses([loss]), _losses([expected["next_loss"]]),
                _tol(case, "reshard", "next_loss"))
    scale = tolerances.ParamScale(*expected["scale"])
    rec.compare("reshard", "next_params", run.full_params(), expected["next_params"],
                _tol(case, "reshard", "next_params", scale))


PHASES = {"train": train, "reshard": reshard}
