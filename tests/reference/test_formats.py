"""Tests for harness.reference.formats: hand-computed encodings, saturation,
zero handling and round-trip error bounds derived from each format."""

import math

import pytest
import torch

from harness.reference.formats import block, fp8, mxfp8, nvfp4

NAN, INF = float("nan"), float("inf")
SLACK = 1 + 1e-6  # fp32 rounding in scale_inv / products, far below any format step


def _randn(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def _u8(vals):
    return torch.tensor(vals, dtype=torch.uint8)


# Error bound for a saturating RNE cast to an FP8 format, in units of the value
# being cast (v = x * scale):
#   normal |v| in [2**e, 2**(e+1)): spacing 2**(e - m) (m = mantissa bits), RNE error
#     <= half spacing = 2**(e - m - 1) <= |v| * eps / 2      (eps = 2**-m)
#   subnormal: fixed spacing 2**(emin - m), error <= 2**(emin - m - 1)
# => |err(v)| <= max(|v| * eps / 2, SUB_HALF_STEP[fmt]). Dividing by the scale gives
# the bound on x. E4M3: emin = -6, m = 3 -> 2**-10;  E5M2: emin = -14, m = 2 -> 2**-17.
SUB_HALF_STEP = {"e4m3": 2.0**-10, "e5m2": 2.0**-17}


def _fp8_bound(x, unit, fmt):
    """Per-element bound on |deq - x| when x / unit was cast to fmt (unit = 1/scale)."""
    return torch.maximum(x.abs() * fmt.eps / 2, SUB_HALF_STEP[fmt.name] * unit) * SLACK


# ----------------------------------------------------------------------------- fp8


def test_e4m3_hand_values():
    x = torch.tensor([1.0, 0.0, -0.0, 448.0, -448.0, 0.5, 2.0**-9, 1.0625, 1.1875])
    q = fp8.quantize(x, torch.tensor(1.0), fp8.E4M3)
    # 1.0 = 0.0111.000; max 448 = 1.75*2**8 = 0.1111.110; 2**-9 = smallest subnormal;
    # 1.0625 is halfway 1.0|1.125 -> even mantissa 1.0; 1.1875 halfway 1.125|1.25 -> 1.25
    assert q.dtype == torch.uint8
    assert q.tolist() == [0x38, 0x00, 0x80, 0x7E, 0xFE, 0x30, 0x01, 0x38, 0x3A]


def test_e5m2_hand_values():
    x = torch.tensor([1.0, 0.0, -0.0, 57344.0, -57344.0, 2.0**-16, 1.125])
    q = fp8.quantize(x, torch.tensor(1.0), fp8.E5M2)
    # 1.0 = 0.01111.00; max = 1.75*2**15 = 0.11110.11; 2**-16 smallest subnormal;
    # 1.125 halfway 1.0|1.25 -> 1.0
    assert q.tolist() == [0x3C, 0x00, 0x80, 0x7B, 0xFB, 0x01, 0x3C]


@pytest.mark.parametrize("fmt", [fp8.E4M3, fp8.E5M2])
def test_fp8_saturation_and_nan(fmt):
    x = torch.tensor([fmt.max * 1.5, -fmt.max * 3, INF, -INF, NAN, 1e30])
    q = fp8.quantize(x, torch.tensor(1.0), fmt)
    d = fp8.dequantize(q, torch.tensor(1.0), fmt)
    assert d[:4].tolist() == [fmt.max, -fmt.max, fmt.max, -fmt.max]
    assert math.isnan(d[4].item())
    assert d[5].item() == fmt.max


def test_scale_from_amax_conventions():
    E4M3 = fp8.E4M3
    assert fp8.scale_from_amax(torch.tensor(448.0), E4M3).item() == 1.0
    assert fp8.scale_from_amax(torch.tensor(2.0), E4M3, margin=1).item() == 112.0
    for bad in (0.0, INF, NAN):
        assert fp8.scale_from_amax(torch.tensor(bad), E4M3).item() == 1.0
    tiny = fp8.scale_from_amax(torch.tensor(1e-45), E4M3)
    assert torch.isfinite(tiny) and tiny.item() > 0
    assert fp8.amax(torch.empty(0)).item() == 0.0
    assert fp8.amax(torch.tensor([-3.0, 2.0])).item() == 3.0


def test_fp8_zero_tensor():
    x = torch.zeros(4, 8)
    scale, scale_inv = fp8.current_scale(x, fp8.E4M3)
    assert scale.item() == 1.0 and scale_inv.item() == 1.0
    q = fp8.quantize(x, scale, fp8.E4M3)
    assert torch.all(q == 0)
    d = fp8.dequantize(q, scale_inv, fp8.E4M3)
    assert torch.equal(d, x)
    nz = fp8.quantize(-x, scale, fp8.E4M3)  # -0.0 keeps its sign bit
    assert torch.all(nz == 0x80)


@pytest.mark.parametrize("fmt", [fp8.E4M3, fp8.E5M2])
def test_fp8_current_scaling_roundtrip_bound(fmt):
    x = _randn(64, 96) * 3
    scale, scale_inv = fp8.current_scale(x, fmt)
    d = fp8.dequantize(fp8.quantize(x, scale, fmt), scale_inv, fmt)
    err = (d - x).abs()
    assert torch.all(err <= _fp8_bound(x, scale_inv, fmt))
    # Elements in the normal range obey the pure relative bound eps/2 (2**-4 for E4M3).
    assert torch.all(err <= x.abs() * fmt.eps / 2 * SLACK)
    # The amax element lands on the format max.
    assert d.abs().max().item() == pytest.approx(x.abs().max().item(), rel=1e-6)
    assert (x.abs().max() * scale).item() == pytest.approx(fmt.max, rel=1e-6)


def test_current_scale_reduce_amax():
    x = torch.tensor([1.0, -2.0])
    s, si = fp8.current_scale(x, fp8.E4M3, reduce_amax=lambda a: torch.maximum(a, torch.tensor(8.0)))
    assert s.item() == 56.0 and si.item() == pytest.approx(1 / 56.0, rel=1e-6)

    def in_place(a):  # like dist.all_reduce: mutates, returns no tensor
        a.fill_(4.0)

    s, _ = fp8.current_scale(x, fp8.E4M3, margin=1, reduce_amax=in_place)
    assert s.item() == 56.0


def test_delayed_scaling_history_and_algos():
    ds = fp8.DelayedScaling(history_len=4, algo="max")
    assert ds.scale.item() == 1.0 and ds.scale_inv.item() == 1.0
    ds.update()  # empty (all-zero) history -> scale stays 1
    assert ds.scale.item() == 1.0
    for a in (1.0, 7.0, 2.0):
        ds.record(torch.tensor(a))
    assert ds.amax_history.tolist() == [2.0, 7.0, 1.0, 0.0]  # newest at index 0
    ds.update()
    assert ds.scale.item() == 64.0 and ds.scale_inv.item() == 1 / 64.0  # 448 / max 7
    for a in (0.5, 0.25, 4.0):
        ds.record(torch.tensor(a))
    assert ds.amax_history.tolist() == [4.0, 0.25, 0.5, 2.0]  # 7 and 1 rolled out
    ds.update()
    assert ds.scale.item() == 112.0

    mr = fp8.DelayedScaling(history_len=4, algo="most_recent")
    for a in (7.0, 2.0):
        mr.record(torch.tensor(a))
    mr.update()
    assert mr.scale.item() == 224.0  # 448 / most recent 2


def test_delayed_scaling_margin():
    scales = []
    for margin in (0, 1, 2):
        ds = fp8.DelayedScaling(history_len=2, margin=margin, fmt=fp8.E5M2)
        ds.record(torch.tensor(7.0))
        ds.update()
        scales.append(ds.scale.item())
    assert scales == [8192.0, 4096.0, 2048.0]  # 57344/7 = 8192, halved per margin unit
    with pytest.raises(ValueError):
        fp8.DelayedScaling(algo="mean")


# --------------------------------------------------------------------------- block


@pytest.mark.parametrize("blk", [(1, 128), (128, 128)])
@pytest.mark.parametrize("fmt", [fp8.E4M3, fp8.E5M2])
def test_block_roundtrip_bound_partial(blk, fmt):
    x = _randn(200, 130, seed=1) * 5  # both dims end in a partial block
    data, sinv = block.quantize_blockwise(x, blk, fmt)
    mb, nb = -(-200 // blk[0]), -(-130 // blk[1])
    assert data.shape == (200, 130) and data.dtype == torch.uint8
    assert sinv.shape == (mb, nb) and sinv.dtype == torch.float32
    d = block.dequantize_blockwise(data, sinv, blk, fmt)
    unit = block.expand_blocks(sinv, *blk, x.shape)
    assert torch.all((d - x).abs() <= _fp8_bound(x, unit, fmt))
    # each block's own amax maps (up to fp32 rounding of scale) onto fmt.max
    codes_max = block.block_amax(data.view(fmt.torch_dtype).float(), *blk)
    assert torch.all(codes_max == fmt.max)
    # scale_inv = amax_block / fmt.max for the partial edge blocks too
    ref = block.block_amax(x, *blk) / fmt.max
    torch.testing.assert_close(sinv, ref, rtol=1e-6, atol=0)


def test_block_rowwise_equals_per_tensor_rows():
    x = _randn(3, 128, seed=2)
    data, sinv = block.quantize_blockwise(x, (1, 128))
    for r in range(3):
        s = fp8.scale_from_amax(fp8.amax(x[r]), fp8.E4M3)
        assert torch.equal(data[r], fp8.quantize(x[r], s, fp8.E4M3))
        assert sinv[r, 0].item() == (1.0 / s).item()


def test_block_power_of_2_scales():
    x = _randn(130, 256, seed=3) * 7
    data, sinv = block.quantize_blockwise(x, (128, 128), power_of_2_scales=True)
    mant, _ = torch.frexp(sinv)
    assert torch.all(mant == 0.5)  # exact powers of two
    amax = block.block_amax(x, 128, 128)
    # scale rounded DOWN => amax * scale in (224, 448]: no saturation, < 2x headroom
    v = amax / sinv
    assert torch.all(v <= 448) and torch.all(v > 224)
    d = block.dequantize_blockwise(data, sinv, (128, 128))
    unit = block.expand_blocks(sinv, 128, 128, x.shape)
    assert torch.all((d - x).abs() <= _fp8_bound(x, unit, fp8.E4M3))


def test_block_zero_blocks_eps_and_nd_input():
    x = torch.zeros(2, 3, 128)
    x[1, 2] = _randn(128, seed=4)
    data, sinv = block.quantize_blockwise(x, (1, 128))
    assert data.shape == (6, 128) and sinv.shape == (6, 1)  # (prod(shape[:-1]), shape[-1])
    assert sinv[:5].flatten().tolist() == [1.0] * 5 and torch.all(data[:5] == 0)
    d = block.dequantize_blockwise(data, sinv, (1, 128))
    assert torch.equal(d[:5], torch.zeros(5, 128))
    _, sinv_eps = block.quantize_blockwise(torch.zeros(4, 4), (1, 128), eps=2.0)
    assert torch.allclose(sinv_eps, torch.full((4, 1), 2.0 / 448), rtol=1e-6, atol=0)  # amax clamped up to eps
    data1, sinv1 = block.quantize_blockwise(torch.arange(4.0), (1, 128))  # 1-D -> one row
    assert data1.shape == (1, 4) and sinv1.item() == pytest.approx(3.0 / 448, rel=1e-6)


# --------------------------------------------------------------------------- mxfp8


def test_e8m0_codes():
    assert mxfp8.float_to_e8m0(torch.tensor([1.0, 2.0**-3, 2.0**-127, 2.0**127])).tolist() == [
        127, 124, 0, 254]
    f = mxfp8.e8m0_to_float(_u8([127, 124, 0, 254, 255]))
    assert f[:4].tolist() == [1.0, 0.125, 2.0**-127, 2.0**127]
    assert math.isnan(f[4].item())
    allc = torch.arange(255).to(torch.uint8)
    assert torch.equal(mxfp8.float_to_e8m0(mxfp8.e8m0_to_float(allc)), allc)


def test_mxfp8_hand_values():
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 1] = 1.0, -0.5      # block 0: amax 1 -> X = 2**(0-8), code 119
    x[0, 32], x[0, 33] = 500.0, 3.0   # block 1: amax 500 -> floor(log2)=8 -> X=1, code 127
    data, sc = mxfp8.quantize_mxfp8(x)
    assert sc.tolist() == [[119, 127]]
    # 1/2**-8 = 256 = 2**8 -> E4M3 0.1111.000 = 0x78; -128 -> 0xF0; 500 saturates to 0x7E
    assert data[0, :2].tolist() == [0x78, 0xF0] and data[0, 32].item() == 0x7E
    d = mxfp8.dequantize_mxfp8(data, sc)
    assert d[0, :2].tolist() == [1.0, -0.5] and d[0, 32].item() == 448.0 and d[0, 33].item() == 3.0
    # E5M2: emax 15 -> amax 1 gives code 127 - 15 = 112
    _, sc5 = mxfp8.quantize_mxfp8(x, fmt=fp8.E5M2)
    assert sc5.tolist() == [[112, 120]]


@pytest.mark.parametrize("fmt", [fp8.E4M3, fp8.E5M2])
def test_mxfp8_roundtrip_bound_partial(fmt):
    # N = 40: one full block of 32 and a partial block of 8 per row.
    x = _randn(16, 40, seed=5) * 4
    x[3, 7] = 1e-3 * x[3, 7]  # a tiny element exercises the subnormal part of the bound
    data, sc = mxfp8.quantize_mxfp8(x, fmt=fmt)
    assert data.shape == (16, 40) and sc.shape == (16, 2) and sc.dtype == torch.uint8
    # shared exponent from the definition, computed independently in float64
    amax = block.block_amax(x, 1, 32).double()
    exp = torch.floor(torch.log2(amax)) - mxfp8.EMAX_ELEM[fmt.name]
    assert torch.equal(sc.long(), (exp + 127).long())
    X = block.expand_blocks(mxfp8.e8m0_to_float(sc), 1, 32, x.shape)
    d = mxfp8.dequantize_mxfp8(data, sc, fmt=fmt)
    # Bound: X = 2**(floor(log2 amax) - emax) puts every |x/X| below 2**(emax+1).
    # If |x/X| <= fmt.max, the cast error is the FP8 RNE bound in units of X:
    #   |err| <= max(|x| * eps/2, X * SUB_HALF_STEP)   (E4M3: |x|*2**-4 or X*2**-10)
    # otherwise (|x/X| in (fmt.max, 2**(emax+1))) it saturates to exactly fmt.max * X.
    sat = (x / X).abs() > fmt.max
    err = (d - x).abs()
    assert torch.all(err[~sat] <= _fp8_bound(x, X, fmt)[~sat])
    assert torch.equal(d[sat], torch.sign(x[sat]) * fmt.max * X[sat])


def test_mxfp8_columnwise_is_rowwise_of_transpose():
    x = _randn(72, 24, seed=6)  # 72 rows: 2 full column blocks + a partial one of 8
    dc, sc = mxfp8.quantize_mxfp8(x, axis=0)
    dr, sr = mxfp8.quantize_mxfp8(x.t().contiguous(), axis=-1)
    assert dc.shape == (72, 24) and sc.shape == (3, 24)
    assert torch.equal(dc, dr.t()) and torch.equal(sc, sr.t())
    assert torch.equal(mxfp8.dequantize_mxfp8(dc, sc, axis=0),
                       mxfp8.dequantize_mxfp8(dr, sr).t())


def test_mxfp8_zero_and_nan_blocks():
    x = torch.zeros(2, 64)
    x[1, 40] = NAN
    x[1, 0] = 2.0
    data, sc = mxfp8.quantize_mxfp8(x)
    assert sc.tolist() == [[0, 0], [120, 255]]  # zero block -> code 0; NaN block -> 255
    assert torch.all(data[0] == 0)
    d = mxfp8.dequantize_mxfp8(data, sc)
    assert torch.equal(d[0], torch.zeros(64))
    assert d[1, 0].item() == 2.0 and torch.all(torch.isnan(d[1, 32:]))


def test_mxfp8_ceil_rounding_never_saturates():
    x = _randn(8, 64, seed=7) * 100
    data, sc = mxfp8.quantize_mxfp8(x, scale_rounding="ceil")
    amax = block.block_amax(x, 1, 32)
    v = amax / mxfp8.e8m0_to_float(sc)
    assert torch.all(v <= 448) and torch.all(v > 224)  # smallest pow2 with amax/X <= 448
    X = block.expand_blocks(mxfp8.e8m0_to_float(sc), 1, 32, x.shape)
    d = mxfp8.dequantize_mxfp8(data, sc)
    assert torch.all((d - x).abs() <= _fp8_bound(x, X, fp8.E4M3))


# --------------------------------------------------------------------------- nvfp4


def test_e2m1_table_and_rounding():
    assert nvfp4.E2M1_VALUES.tolist()[:8] == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    codes = torch.arange(16).to(torch.uint8)
    assert torch.equal(nvfp4.decode_e2m1(codes), nvfp4.E2M1_VALUES)
    assert torch.equal(nvfp4.encode_e2m1(nvfp4.E2M1_VALUES), codes)  # -0.0 -> code 8
    x = torch.tensor([0.25, 0.3, 0.75, 1.25, 2.5, 2.6, 3.5, 5.0, 7.0, INF, -5.0, -0.1, -0.0])
    # ties go to the even code: 0.25->0 (0), 0.75->code 2 (1.0), 1.25->code 2 (1.0),
    # 2.5->code 4 (2.0), 3.5->code 6 (4.0), 5->code 6 (4.0); >6 saturates to code 7
    assert nvfp4.encode_e2m1(x).tolist() == [0, 1, 2, 2, 4, 5, 6, 6, 7, 7, 14, 8, 8]


def test_fp4_pack_nibble_order():
    codes = _u8([[1, 2, 3, 4], [15, 0, 8, 7]])
    packed = nvfp4.pack_fp4(codes)
    assert packed.tolist() == [[0x21, 0x43], [0x0F, 0x78]]  # element 2i low, 2i+1 high
    assert torch.equal(nvfp4.unpack_fp4(packed), codes)
    rnd = torch.randint(0, 16, (5, 6, 10), generator=torch.Generator().manual_seed(8)).to(torch.uint8)
    assert torch.equal(nvfp4.unpack_fp4(nvfp4.pack_fp4(rnd)), rnd)
    with pytest.raises(ValueError):
        nvfp4.pack_fp4(_u8([1, 2, 3]))


def test_nvfp4_hand_values():
    x = torch.tensor([[6.0, 0.25, 0.75, 2.5, 5.0, -1.0, -0.0, 0.0] + [0.0] * 8])
    packed, bs, s_enc = nvfp4.quantize_nvfp4(x, global_amax=torch.tensor(448.0 * 6))
    # S_enc = 2688 / 2688 = 1; block scale = 6 / 6 * 1 = 1.0 -> E4M3 0x38
    assert s_enc.item() == 1.0 and bs.tolist() == [[0x38]]
    # codes 7, 0, 2, 4, 6, 10, 8, 0, then zeros
    assert packed.tolist() == [[0x07, 0x42, 0xA6, 0x08, 0, 0, 0, 0]]
    d = nvfp4.dequantize_nvfp4(packed, bs, s_enc, x.shape)
    assert d[0, :8].tolist() == [6.0, 0.0, 1.0, 2.0, 4.0, -1.0, -0.0, 0.0]
    assert nvfp4.global_scale(torch.tensor(0.0)).item() == 1.0
    assert nvfp4.global_scale(torch.tensor(2.0)).item() == 1344.0


def test_nvfp4_roundtrip_bound():
    x = _randn(64, 80, seed=9) * 2
    packed, bs, s_enc = nvfp4.quantize_nvfp4(x)
    assert packed.shape == (64, 40) and bs.shape == (64, 5) and s_enc.shape == ()
    assert s_enc.item() == pytest.approx(2688 / x.abs().max().item(), rel=1e-6)
    d = nvfp4.dequantize_nvfp4(packed, bs, s_enc, x.shape)
    # In element units (x * S_enc / dec_b) the E2M1 grid has gaps <= 2 (between 4
    # and 6), so round-to-nearest errs by <= 1. Values beyond 6 can only appear
    # because dec_b was rounded down to E4M3 (by < 2**-4 relative), giving at
    # most 6 * 2**-4 = 0.375 < 1 of saturation error. So |err| <= 1 * dec_b / S_enc.
    dec = bs.view(torch.float8_e4m3fn).float()
    unit = block.expand_blocks(dec, 1, 16, x.shape) / s_enc
    err = (d - x).abs()
    assert torch.all(err <= unit * SLACK)
    # Block scale: e4m3(block_amax / 6 * S_enc), within E4M3 half-ULP (2**-4 rel).
    ideal = block.block_amax(x, 1, 16) / 6 * s_enc
    assert torch.all((dec - ideal).abs() <= ideal * 2.0**-4 * SLACK)


def test_nvfp4_columnwise_layout():
    x = _randn(40, 6, seed=10)  # 40 rows: 2 full blocks + a partial block of 8
    pc, bc, sc = nvfp4.quantize_nvfp4(x, axis=0)
    pr, br, sr = nvfp4.quantize_nvfp4(x.t().contiguous())
    assert pc.shape == (20, 6) and bc.shape == (3, 6)
    assert torch.equal(pc, pr.t()) and torch.equal(bc, br.t()) and sc.item() == sr.item()
    # packing along dim 0: rows 2i / 2i+1 in the low / high nibble
    codes = nvfp4.unpack_fp4(pc.t().contiguous()).t()
    assert codes.shape == (40, 6)
    dc = nvfp4.dequantize_nvfp4(pc, bc, sc, x.shape, axis=0)
    assert torch.equal(dc, nvfp4.dequantize_nvfp4(pr, br, sr, (6, 40)).t())
    with pytest.raises(ValueError, match="even"):
        nvfp4.quantize_nvfp4(torch.zeros(3, 16), axis=0)
    with pytest.raises(ValueError, match="even"):
        nvfp4.quantize_nvfp4(torch.zeros(4, 15))


def test_nvfp4_zero_tensor():
    x = torch.zeros(4, 32)
    packed, bs, s_enc = nvfp4.quantize_nvfp4(x)
    assert s_enc.item() == 1.0 and torch.all(bs == 0) and torch.all(packed == 0)
    assert torch.equal(nvfp4.dequantize_nvfp4(packed, bs, s_enc, x.shape), x)


def test_nvfp4_shards_need_shared_global_amax():
    x = _randn(32, 64, seed=11)
    x[16:] *= 10  # second half has a much larger amax
    top, bot = x[:16], x[16:]
    whole = nvfp4.quantize_nvfp4(x)
    own = [nvfp4.quantize_nvfp4(h) for h in (top, bot)]
    assert own[0][2].item() != own[1][2].item()  # each shard derives its own S_enc
    assert not torch.equal(torch.cat([own[0][1], own[1][1]]), whole[1])
    g = fp8.amax(x)  # what an all-reduce MAX of the shards' amaxes yields
    shared = [nvfp4.quantize_nvfp4(h, global_amax=g) for h in (top, bot)]
    # Blocks run along the last dim, so a row split never cuts a block: with the
    # shared amax the shards' bytes concatenate to the whole tensor's bytes.
    for s in shared:
        assert s[2].item() == whole[2].item()
    assert torch.equal(torch.cat([shared[0][0], shared[1][0]]), whole[0])
    assert torch.equal(torch.cat([shared[0][1], shared[1][1]]), whole[1])
