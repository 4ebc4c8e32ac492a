"""sharding_invariance: the sharded run against its one-rank twin.

The FP32 reference (``fp32_parity``) differs from the run under test by the recipe's whole
quantization error, so its tolerances are that wide: a bug that exists only in the distributed
path and moves results by less -- gradients reduced in a lower precision than the policy's, a
reduction done twice or over the wrong ranks, a scale from the wrong group -- passes them. The
twin (``distributed/single.py``) is the same backend, recipe, module, seed, data and steps on one
rank, each data-parallel slice run as a micro-batch: it quantizes every operand as the ranks do
and differs only by the order of the reductions. DelayedScaling's amax histories advance once
per step, from the max over the slices, as the sharded run's all-reduce makes them (the
backend's ``one_update_per_step``; updated per micro-batch instead the twin's params differ by
rel-L2 0.085). Bitwise where that was measured bit-exact, else a tolerance calibrated from the
measured reduction-order noise of the case's population (``calibration/twin.py`` holds the
rule -- which two-slice backends, devices and recipes are bitwise -- and the cases no twin can
stand for).
"""

from __future__ import annotations

from harness.calibration import twin
from harness.calibration.tolerances import BITWISE
from harness.checks.base import Check
from harness.checks.parity import losses, tol

NAME = twin.CHECK


def sharding_invariance(art, rec) -> None:
    t, s = art["trained"], art["single_rank"]
    bitwise = twin.bitwise(art.case, art.ctx.backend.name, art.ctx.device_type)

    def limit(quantity):
        return BITWISE if bitwise else tol(art, NAME, quantity)

    rec.compare(NAME, "loss", losses(t.losses), losses(s.losses), limit("loss"))
    rec.compare(NAME, "grads", t.grads0, s.grads, limit("grads"))
    rec.compare(NAME, "params", t.run.full_params(), s.params, limit("params"))
    if t.run.quantized and s.stored is not None:
        rec.compare(NAME, "stored_params", t.run.full_params(masters=False), s.stored,
                    limit("stored_params"))


CHECK = Check(NAME, ("trained", "single_rank"), sharding_invariance)
