"""What the harness knows: axis values, backends, recipes and checks.

Validation (``spec``), matrix expansion (``matrix``) and the worker all read these tables,
so an unknown value is rejected in one place with one list of what is allowed.
"""

from __future__ import annotations

BACKENDS = ("torch", "reference", "te")
DEFAULT_BACKEND = "torch"

# recipe -> one-line meaning. A backend supports a subset (RECIPES_BY_BACKEND).
RECIPES = {
    "fp32": "fp32 params and compute",
    "bf16": "FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)",
    "delayed": "FP8 per-tensor delayed scaling (amax history)",
    "current": "FP8 per-tensor current scaling",
    "block": "FP8 block scaling (1x128 activations, 128x128 weights)",
    "mxfp8": "MXFP8: 1x32 blocks, E8M0 scales",
    "nvfp4": "NVFP4: E2M1, 16-element blocks, E4M3 block scales, fp32 global scale",
}
QUANTIZED_RECIPES = ("delayed", "current", "block", "mxfp8", "nvfp4")
RECIPES_BY_BACKEND = {
    "torch": ("fp32", "bf16"),
    "reference": ("fp32", "bf16") + QUANTIZED_RECIPES,
    "te": ("bf16",) + QUANTIZED_RECIPES,
}

MODULES = ("Linear", "LayerNormLinear", "LayerNormMLP", "MultiheadAttention", "TransformerLayer")

DCP_MODES = {
    "sync": "torch.distributed.checkpoint.save",
    "async_thread": "dcp.async_save, AsyncCheckpointerType.THREAD",
    "async_process": "dcp.async_save, AsyncCheckpointerType.PROCESS",
}

# check -> what it proves. Checks not applicable to a case (e.g. reshard with reshard=none)
# are not run for it; "applies" below says when a check runs.
CHECKS = {
    "fp32_parity": "per-step loss and final params vs a single-process FP32 reference",
    "dcp_roundtrip": "save -> load into a fresh model/optimizer on the same mesh is bitwise, "
    "and the next step equals the uninterrupted run's",
    "async_equivalence": "an async checkpoint holds the same bytes as the sync one of the same "
    "state, even when training mutates the state right after async_save returns",
    "reshard": "save on mesh A, load on mesh B (another world size): full state bitwise, next "
    "step within tolerance of the uninterrupted run",
    "quantized_allgather_parity": "FSDP2 unshard of quantized params vs manual gather of "
    "dequantized shards and vs FP32 gather-then-quantize",
    "optimizer_state_placement": "every optimizer state is a DTensor with its param's mesh and "
    "placements",
    "weights_only_load": "torch.load(weights_only=True) of a torch.save'd quantized state",
    "safetensors_export": "the FP32 safetensors export (master weights, else params) reloads "
    "bitwise, is all fp32 and equals its sources",
}
DEFAULT_CHECKS = ("fp32_parity", "dcp_roundtrip", "async_equivalence", "reshard")

# Axes every scenario has, in id order. Extra axes (e.g. 'fixes', 'fault') follow them.
CORE_AXES = ("recipe", "mesh", "module", "dcp", "reshard")
RESHARD_NONE = "none"
RESHARD_PREFIX = "to_"

# Fault injections, for the harness's negative controls only (tests/). Each makes one check
# fail or one case hang; the worker implements them in worker/faults.py.
FAULTS = {
    "none": "no fault",
    "perturb_loaded": "add 1e-3 to one element of one loaded parameter",
    "skip_load": "do not load the checkpoint into the fresh model",
    "perturb_reference": "scale the FP32 reference's learning rate by 1.01",
    "hang": "rank 1 sleeps far past the case timeout",
    "crash": "rank 1 exits with code 3 in the middle of the case",
    "raise": "rank 0 raises RuntimeError in the middle of the case",
}


def check_applies(check: str, axes: dict[str, str]) -> bool:
    if check in ("quantized_allgather_parity", "weights_only_load"):
        return axes.get("recipe") in QUANTIZED_RECIPES
    if check == "async_equivalence":
        return axes.get("dcp", "sync") != "sync"
    if check == "reshard":
        return axes.get("reshard", RESHARD_NONE) != RESHARD_NONE
    return True
