"""TE #2974 (NVFP4) / #2713 (weight_mesh): reduce the amax over the weight's shard group.

Per-tensor current scaling and NVFP4's global scale come from the amax of the *whole* weight.
A sharded weight (FSDP2, and TP for weights) must all-reduce its local amax over every rank
holding a piece of it -- the shard group, not the replicate dim of HSDP. Before the fix each
shard used its own amax: shards get different scales, and the FSDP2 quantized all-gather
(which keeps one rank's scale) differs from an FP32 gather-then-quantize.
"""

from harness.reference.fixes import on

NAME = "amax_reduction_group"


def group(weight_group):
    """The process group to reduce amax over, or None (local amax)."""
    return weight_group if on(NAME) else None
