"""Where the sharding-invariance twin stands for a case, and how it is judged.

The twin (``distributed/single.py``) runs the case's backend, recipe, module, seed, data and
steps without data parallelism -- on one rank, or under tensor parallelism on the TP ranks of
the first data-parallel slice with the case's own TP split -- each data-parallel slice as a
micro-batch; what is left to differ from the sharded run is the order of the data-parallel
gradient reduction. Over two slices that is ``a + b`` either way: measured bit-exact on CPU
for the torch and reference backends, every recipe (fp32, bf16, current, delayed, block,
mxfp8, nvfp4; dp2 and hsdp2x1, with and without TP; LayerNormMLP, TransformerLayer) -- there
the check is bitwise. Everywhere else (4 / 8 slices, a GPU) it takes a tolerance calibrated
from the measured reduction-order noise of its population
(``scenarios/calibration_invariance.yaml``, or on demand), like fp32_parity's -- orders of
magnitude under the FP32 reference's, which must absorb the recipe's whole quantization error.
The twin keeps TP because a one-rank twin is not the same computation under TP: each TP rank
rounds its row-parallel partial output (bf16) or scales its input shard from the shard's own
amax (current, nvfp4) before the ranks sum them.
"""

from __future__ import annotations

CHECK = "sharding_invariance"
SCENARIO = "calibration_invariance"  # where its tolerances are measured
QUANTITIES = ("loss", "grads", "params", "stored_params")
BITWISE_ON = (("torch", "cpu"), ("reference", "cpu"))
BLOCK_FORMATS = ("block", "mxfp8", "nvfp4")


def not_applicable(case, backend: str, device: str) -> str | None:
    """Why no twin can stand for ``case`` (None: one can)."""
    if case.mesh.dp_size < 2:
        return "one data-parallel slice: the twin would be the run itself"
    return None


def bitwise(case, backend: str, device: str) -> bool:
    """The twin is bit-exact here (measured): two slices, a backend / device of
    ``BITWISE_ON``."""
    return (backend, device) in BITWISE_ON and case.mesh.dp_size == 2


def calibrated(case, backend: str, device: str) -> bool:
    """The check takes a calibrated tolerance for ``case`` (it runs, and not bitwise)."""
    return not_applicable(case, backend, device) is None and not bitwise(case, backend, device)
