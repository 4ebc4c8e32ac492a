"""Where the sharding-invariance twin stands for a case, and how it is judged.

The twin (``distributed/single.py``) runs the case's backend, recipe, module, seed, data and
steps without data parallelism -- on one rank, or under tensor parallelism on the TP ranks of
the first data-parallel slice with the case's own TP split -- each data-parallel slice as a
micro-batch; what is left to differ from the sharded run is the order of the data-parallel
gradient reduction. Over two slices that is ``a + b`` either way: measured bit-exact for the
torch and reference backends, every recipe (fp32, bf16, current, delayed, block, mxfp8, nvfp4),
on CPU (dp2 and hsdp2x1, with and without TP; LayerNormMLP, TransformerLayer) and on a GPU
(every two-slice case of fsdp2_tp_dcp and llama_stack: dp2 over NCCL and shared gloo, dp2xtp2),
and on a GPU for TE's bf16, Float8CurrentScaling and Float8BlockScaling (every two-slice case of
the shipped TE scenarios, NCCL and shared gloo, dp2xtp2 included) -- there the check is bitwise.
Everywhere else it takes a tolerance calibrated from the measured reduction-order noise of its
population (``scenarios/calibration_invariance.yaml``, or on demand), like fp32_parity's --
orders of magnitude under the FP32 reference's, which must absorb the recipe's whole
quantization error: 4 / 8 slices; TE's MXFP8 / NVFP4 (not measured); TE's DelayedScaling,
whose weight when not stored quantized (a model built outside ``quantized_model_init``) is
quantized again in the backward with the scale the sharded run has updated by then and the
twin not yet.
The twin keeps TP because a one-rank twin is not the same computation under TP: each TP rank
rounds its row-parallel partial output (bf16) or scales its input shard from the shard's own
amax (current, nvfp4) before the ranks sum them.
"""

from __future__ import annotations

CHECK = "sharding_invariance"
SCENARIO = "calibration_invariance"  # where its tolerances are measured
QUANTITIES = ("loss", "grads", "params", "stored_params")
# (backend, device, recipes) where two slices are bit-exact (measured); None: every recipe
BITWISE_ON = (("torch", "cpu", None), ("reference", "cpu", None), ("torch", "cuda", None),
              ("reference", "cuda", None), ("te", "cuda", ("bf16", "current", "block")))
BLOCK_FORMATS = ("block", "mxfp8", "nvfp4")


def not_applicable(case, backend: str, device: str) -> str | None:
    """Why no twin can stand for ``case`` (None: one can)."""
    if case.mesh.dp_size < 2:
        return "one data-parallel slice: the twin would be the run itself"
    return None


def bitwise(case, backend: str, device: str) -> bool:
    """The twin is bit-exact here (measured): two slices, a backend / device / recipe of
    ``BITWISE_ON``."""
    return case.mesh.dp_size == 2 and any(
        (b, d) == (backend, device) and (recipes is None or case.recipe in recipes)
        for b, d, recipes in BITWISE_ON)


def calibrated(case, backend: str, device: str) -> bool:
    """The check takes a calibrated tolerance for ``case`` (it runs, and not bitwise)."""
    return not_applicable(case, backend, device) is None and not bitwise(case, backend, device)
