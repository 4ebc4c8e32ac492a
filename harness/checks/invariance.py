"""sharding_invariance: the sharded run against its one-rank twin, bit for bit.

The FP32 reference (``fp32_parity``) differs from the run under test by the recipe's whole
quantization error, so its tolerances are that wide: a bug that exists only in the distributed
path and moves results by less -- gradients reduced in a lower precision than the policy's, a
reduction done twice or over the wrong ranks, a scale from the wrong group -- passes them. The
twin (``distributed/single.py``) is the same backend, recipe, module, seed, data and steps on one
rank, each data-parallel rank's slice run as a micro-batch: it quantizes every operand as that
rank does and differs only by the order of the gradient reduction, which over two slices is
``a + b`` either way. DelayedScaling's amax histories advance once per step, from the max over
the slices, as the sharded run's all-reduce makes them (the backend's ``one_update_per_step``;
updated per micro-batch instead the twin's params differ by rel-L2 0.085). Measured on CPU
(reference and torch backends, LayerNormMLP and TransformerLayer, dp2 and hsdp2x1): loss,
first-step grads, final params and stored params bit-exact for fp32, bf16,
Float8CurrentScaling and DelayedScaling. So the check is bitwise, and runs only where
that was measured (``not_applicable`` names the rest, with the measurement that excludes it).
"""

from __future__ import annotations

from harness.calibration.tolerances import BITWISE
from harness.checks.base import Check
from harness.checks.parity import losses

NAME = "sharding_invariance"
RECIPES = ("fp32", "bf16", "current", "delayed")
BACKENDS = ("torch", "reference")


def not_applicable(case, backend: str, device: str) -> str | None:
    """Why the twin cannot stand for ``case`` bit for bit (None: it can)."""
    if backend not in BACKENDS or device != "cpu":
        return (f"the one-rank twin is measured bit-exact on {', '.join(BACKENDS)} / cpu only; "
                f"not yet on {backend} / {device}")
    if case.mesh.tp > 1:
        return "the one-rank twin runs the data-parallel slices, not tensor parallelism"
    if case.mesh.dp_size != 2:
        return (f"{case.mesh.dp_size} data-parallel slices: the twin accumulates them in another "
                f"order than the reduce-scatter (measured on CPU at dp4 / hsdp2x2: params "
                f"max_abs up to 1.1e-5 for current, 3.4e-7 for fp32); bitwise only over 2")
    if case.recipe not in RECIPES:
        return (f"{case.recipe}: the block formats fail to train on a one-rank FSDP2 mesh (no "
                f"all-gather, so no rowwise / columnwise usages -- as their hsdp2x1 cases)")
    return None


def sharding_invariance(art, rec) -> None:
    t, s = art["trained"], art["single_rank"]
    rec.compare(NAME, "loss", losses(t.losses), losses(s.losses), BITWISE)
    rec.compare(NAME, "grads", t.grads0, s.grads, BITWISE)
    rec.compare(NAME, "params", t.run.full_params(), s.params, BITWISE)
    if t.run.quantized and s.stored is not None:
        rec.compare(NAME, "stored_params", t.run.full_params(masters=False), s.stored, BITWISE)


CHECK = Check(NAME, ("trained", "single_rank"), sharding_invariance)
