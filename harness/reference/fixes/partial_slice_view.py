"""A partial slice of a blocked quantized tensor is a view of its blocks (no TE PR: TE 2.20.2).

DCP loads a saved chunk into ``target.narrow(dim, offset, length)`` wherever the chunk fills only
part of a rank's target shard: a reshard whose target shard spans several saved shards (4 -> 2,
3 -> 2, 2 -> 3). TE's Float8BlockwiseQTensor and MXFP8Tensor keep a slice only where it covers
the whole dim; any other slice is a dequantized copy, the chunk is copied into that copy and lost,
and the target keeps what it held before the load (TE's NVFP4Tensor raises on such a slice; the
reference's NVFP4 without the fix copies, like the others). Fixed: the slice is a view of the
blocks (start and end on block boundaries), and the copy writes through. Float8Tensor
(per-tensor scales) slices as a view in TE too.
"""

from harness.reference.fixes import on

NAME = "partial_slice_view"
BLOCKED = ("block", "mxfp8", "nvfp4")  # the reference codecs of TE's blocked tensors


def keeps_view(codec: str, whole_dim: bool) -> bool:
    """Whether a slice of a tensor of ``codec`` is a view (``whole_dim``: it covers the dim)."""
    return whole_dim or codec not in BLOCKED or on(NAME)
