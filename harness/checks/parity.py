"""fp32_parity: the run under test against the single-process FP32 reference.

Compares the per-step loss, the first step's gradients and the final parameters of the
sharded (and possibly quantized) run with a single-process FP32 run of the same module on the
whole global batch, each within its calibrated tolerance (``harness/calibration/tolerances.py``).
Parameters are the optimizer's fp32 master weights where it keeps them (``params``: free of
the format's rounding, so a wrong learning rate shows) and, for quantized recipes, the
quantized weights themselves (``stored_params``). ``update_norms`` compares how far each
parameter moved (the L2 norm of final - initial) with how far the reference's moved: Adam's
steps have a size set by the learning rate whatever the gradient noise of a format, so a wrong
step size shows here long before it shows in the parameters. Also: every parameter with a
non-zero gradient moved (an optimizer that silently skips a parameter can stay inside a tolerance for a
few steps).
"""

from __future__ import annotations

import torch

from harness.calibration import tolerances
from harness.checks.base import Check
from harness.distributed.gather import held
from harness.spec import catalog


def losses(values) -> dict:
    return {"loss": torch.tensor(values, dtype=torch.float64)}


def population(art) -> tolerances.Population:
    """Where this case runs, as its calibration population: backend, device, the process
    groups' backend (nccl, or gloo on CPU and where ranks share a GPU), the case mesh's world
    size, the module."""
    import torch.distributed as dist
    case = art.case
    pg = "nccl" if "nccl" in str(dist.get_backend()) else "gloo"
    return tolerances.Population.of_case(case, art.ctx.device_type, pg)


def tol(art, check, quantity):
    """The calibrated tolerance for the case's recipe, loss (``catalog.TASK_LOSS`` of its
    task) and population at the case's configuration; where none was measured there (a new
    configuration, recipe or hardware) the quantity is recorded unjudged: the plugin judges it
    by a population calibrated on demand for that configuration, or it stays unjudged."""
    case = art.case
    try:
        return tolerances.lookup(check, quantity, case.recipe, case.tolerances, case.train,
                                 loss=catalog.TASK_LOSS[case.task], where=population(art))
    except tolerances.MissingTolerance as e:
        return tolerances.Tolerance.none_for(str(e))


def fp32_parity(art, rec) -> None:
    case, t, ref = art.case, art["trained"], art["reference"]
    rec.compare("fp32_parity", "loss", losses(t.losses), losses(ref.losses),
                tol(art, "fp32_parity", "loss"))
    rec.compare("fp32_parity", "grads", t.grads0, ref.grads, tol(art, "fp32_parity", "grads"))
    final = t.run.full_params()  # fp32 master weights where the optimizer keeps them
    rec.compare("fp32_parity", "params", final, ref.params, tol(art, "fp32_parity", "params"))
    rec.compare("fp32_parity", "update_norms", _update_norms(final, t.initial),
                _update_norms(ref.params, ref.initial), tol(art, "fp32_parity", "update_norms"))
    if t.run.quantized:  # the quantized weights themselves, within the format's rounding
        rec.compare("fp32_parity", "stored_params", t.run.full_params(masters=False),
                    ref.params, tol(art, "fp32_parity", "stored_params"))
    # whole tensors are held by rank 0 only (distributed/gather.py); a rank's own plain ones
    # (a master weight that is no DTensor) by that rank
    frozen = [n for n, g in t.grads0.items()
              if n in final and all(held(x) for x in (g, final[n], t.initial.get(n)))
              and bool(g.abs().max() > 0) and torch.equal(final[n], t.initial[n])]
    rec.flag("fp32_parity", "params_updated", not frozen,
             f"{len(frozen)} parameters did not move during training: {', '.join(frozen[:6])}"
             if frozen else "every parameter with a gradient moved")


def _update_norms(final: dict, initial: dict) -> dict:
    """How far each parameter moved; a parameter whose shape changed (the params comparison
    names it) has no update to measure."""
    return {n: (final[n].double() - initial[n].double()).norm().reshape(1)
            for n in sorted(final) if n in initial and final[n].shape == initial[n].shape}


CHECK = Check("fp32_parity", ("trained", "reference"), fp32_parity)
