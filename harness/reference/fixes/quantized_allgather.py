"""The FSDP2 FP8 / MXFP8 all-gather hooks (``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``).

With the hooks FSDP2 all-gathers a quantized parameter's raw bytes and scales: the rowwise copy
for the forward, the columnwise copy for a backward re-gather (both when the module does not
reshard after forward), and rebuilds a QuantizedTensor. Without them FSDP2 gathers
``view(-1)`` of the shard -- the dequantized values, 4 bytes per element -- and the module sees
a plain tensor.
"""

from harness.reference.fixes import on

NAME = "quantized_allgather"


def enabled() -> bool:
    return on(NAME)
