"""QuantizedTensor ops FSDP2 and DCP rely on, and each #2974 fix switched on and off (single
process; the distributed behaviour is covered by the fix_verification scenario)."""

import io
import pickle

import pytest
import torch

from harness.reference import fixes
from harness.reference.codecs import QuantizedLayoutError
from harness.reference.formats.fp8 import E4M3
from harness.reference.qtensor import (
    FSDPQuantizedTensor,
    QuantizedTensor,
    assemble,
    full_parts,
)
from harness.reference.quantizers import QuantState, WeightQuantizer


@pytest.fixture(autouse=True)
def all_fixes_on():
    fixes.configure("all")
    yield
    fixes.configure("all")


def q(recipe="mxfp8", shape=(64, 96), seed=0):
    torch.manual_seed(seed)
    x = torch.randn(*shape)
    state = QuantState() if recipe == "delayed" else None
    if state is not None:  # a delayed scale from an earlier amax, as after one step
        state.record("weight", x.abs().max(), E4M3)
    return x, WeightQuantizer(recipe, state=state).quantize(x)


def same_parts(a, b):
    return a._parts.keys() == b._parts.keys() and all(
        torch.equal(a._parts[k].view(-1).view(torch.uint8), b._parts[k].view(-1).view(torch.uint8))
        for k in a._parts)


@pytest.mark.parametrize("recipe", ["delayed", "current", "block", "mxfp8", "nvfp4"])
def test_roundtrip_error_within_format(recipe):
    from harness.checks.export import WEIGHT_ROUNDING
    x, t = q(recipe, (256, 256)) if recipe == "block" else q(recipe)
    assert isinstance(t, FSDPQuantizedTensor) and t.shape == x.shape and t.dtype == torch.float32
    rel = ((t.dequantize() - x).norm() / x.norm()).item()
    assert rel < WEIGHT_ROUNDING[recipe], (recipe, rel)  # below the format's unit roundoff


def test_split_on_block_boundaries_shares_parts():
    _, t = q("mxfp8", (64, 96))
    a, b = torch.split(t, 32, dim=0)
    assert isinstance(a, QuantizedTensor) and tuple(a.shape) == (32, 96)
    assert a._parts["col_scale"].shape == (1, 96) and a._parts["row_scale"].shape == (32, 3)
    assert a._parts["row_data"].data_ptr() == t._parts["row_data"].data_ptr()  # a view
    assert torch.equal(torch.cat([a.dequantize(), b.dequantize()]), t.dequantize())


def test_split_inside_a_block_is_a_clear_error():
    _, t = q("mxfp8", (64, 96))
    with pytest.raises(QuantizedLayoutError, match="blocks of 32 along dim 0; cannot cut"):
        torch.split(t, 24, dim=0)
    _, blk = q("block", (256, 128))
    with pytest.raises(QuantizedLayoutError, match="block: part 'scale_inv' has blocks of 128"):
        blk.narrow(0, 0, 64)


def test_copy_raw_requantize_and_dequantize():
    x, t = q("current")
    _, other = q("current", seed=1)
    other.copy_(t)
    assert same_parts(other, t)
    fresh = torch.empty_like(t)
    fresh.copy_(x)  # high precision into a quantized tensor: re-quantized with its quantizer
    assert same_parts(fresh, t)
    plain = torch.empty(t.shape)
    plain.copy_(t)
    assert torch.equal(plain, t.dequantize())


def test_view_same_shape_aliases_other_shapes_dequantize():
    _, t = q("mxfp8")
    v = t.view(t.shape)
    assert isinstance(v, QuantizedTensor) and v._parts["row_data"] is t._parts["row_data"]
    flat = t.view(-1)
    assert type(flat) is torch.Tensor and torch.equal(flat, t.dequantize().view(-1))


def test_new_zeros_and_clone_keep_the_format():
    _, t = q("nvfp4")
    z = t.new_zeros((32, 96))
    assert isinstance(z, QuantizedTensor) and torch.equal(z.dequantize(), torch.zeros(32, 96))
    c = t.clone()
    assert same_parts(c, t) and c._parts["row_data"].data_ptr() != t._parts["row_data"].data_ptr()


def test_to_copy_dtype_change_dequantizes():
    x, t = q("current")
    h = t.to(torch.bfloat16)
    assert type(h) is torch.Tensor and h.dtype == torch.bfloat16
    assert torch.equal(h, t.dequantize().to(torch.bfloat16))


def test_fallback_ops_compute_on_dequantized_values():
    _, t = q("current")
    assert torch.equal(t + 1, t.dequantize() + 1)
    t2 = t.clone()
    t2.mul_(2.0)  # in place: re-quantized into the quantized tensor
    assert isinstance(t2, QuantizedTensor)
    assert torch.allclose(t2.dequantize(), 2 * t.dequantize(), rtol=2 ** -3)


# --- the fixes, on and off -------------------------------------------------------------------
@pytest.mark.parametrize("recipe", ["block", "mxfp8", "nvfp4"])
def test_a_partial_slice_is_a_view_a_load_writes_through(recipe):
    """DCP loads a saved chunk into ``target.narrow(...)``: with the fix the copy writes into the
    target's blocks; without it (TE 2.20.2's blocked tensors) that narrow is a dequantized copy
    and the chunk is lost. Slices of the whole dim, and per-tensor FP8, stay views either way."""
    _, chunk = q(recipe, (128, 128), seed=1)
    _, t = q(recipe, (256, 128))
    t.narrow(0, 128, 128).copy_(chunk)
    assert torch.equal(t.dequantize()[128:], chunk.dequantize())
    fixes.configure("no_partial_slice_view")
    _, t = q(recipe, (256, 128))
    before = t.dequantize().clone()
    part = t.narrow(0, 128, 128)
    assert type(part) is torch.Tensor
    part.copy_(chunk)
    assert torch.equal(t.dequantize(), before)  # the chunk went into the copy
    assert isinstance(t.narrow(0, 0, 256), QuantizedTensor)
    assert isinstance(q("current", (256, 128))[1].narrow(0, 128, 128), QuantizedTensor)


def test_empty_untyped_storage():
    _, t = q()
    assert t.untyped_storage().size() == 0 and t.untyped_storage().data_ptr() == 0
    fixes.configure("no_empty_untyped_storage")
    with pytest.raises(RuntimeError, match="invalid python storage"):
        t.untyped_storage().data_ptr()


def test_new_empty_on_a_device_is_the_staging_copy():
    _, t = q("current")
    staged = t.new_empty(t.shape, device="cpu")
    assert isinstance(staged, QuantizedTensor)
    fixes.configure("no_to_copy_keeps_subclass")
    staged = t.new_empty(t.shape, device="cpu")
    assert type(staged) is torch.Tensor and torch.equal(staged, t.dequantize())


def test_weights_only_pickle():
    _, t = q("nvfp4")
    buf = io.BytesIO()
    torch.save({"w": t}, buf)
    loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)["w"]
    assert same_parts(loaded, t) and loaded._quantizer is None
    fixes.configure("no_weights_only_pickle")
    buf = io.BytesIO()
    torch.save({"w": t}, buf)
    with pytest.raises(pickle.UnpicklingError, match="getattr"):
        torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    assert same_parts(torch.load(io.BytesIO(buf.getvalue()), weights_only=False)["w"], t)


def test_fsdp_hooks_follow_the_quantized_allgather_fix():
    assert hasattr(q()[1], "fsdp_pre_all_gather")
    fixes.configure("no_quantized_allgather")
    t = q()[1]
    assert not hasattr(t, "fsdp_pre_all_gather") and isinstance(t, QuantizedTensor)


def test_unknown_fix_is_rejected():
    with pytest.raises(ValueError, match="expected 'all' or 'no_<fix>'"):
        fixes.configure("no_such_fix")


def test_assemble_chunks_gives_the_whole_tensor():
    _, t = q("nvfp4", (64, 96))
    chunks = [((0, 0), t.narrow(0, 0, 32).clone()), ((32, 0), t.narrow(0, 32, 32).clone())]
    whole = assemble(chunks, (64, 96))
    assert whole.keys() == full_parts(t).keys()
    assert all(torch.equal(whole[k], full_parts(t)[k]) for k in whole)
