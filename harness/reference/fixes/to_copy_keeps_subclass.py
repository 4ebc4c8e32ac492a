"""TE #2974: ``.cpu()`` / ``_to_copy`` / ``new_empty(device=...)`` keep the QuantizedTensor.

DCP stages a checkpoint on the CPU (async saves always; sync saves from GPU) by
``x.new_empty(..., device="cpu")`` + copying ``x.__dict__``, or by ``x.to("cpu")``. Before the
fix these returned a plain tensor of dequantized (high-precision) values: the checkpoint then
holds 4-byte floats instead of the quantized bytes + scales, async and sync checkpoints differ,
and a reload re-quantizes (the bytes are not restored). With the fix the inner buffers are moved
as they are and the subclass survives.
"""

from harness.reference.fixes import on

NAME = "to_copy_keeps_subclass"


def keeps_subclass() -> bool:
    return on(NAME)
