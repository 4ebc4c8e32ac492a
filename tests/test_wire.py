"""Bytes on the wire: a quantized parameter's all-gather moves at most its format's bytes per
element (harness/checks/wire.py): 1 for FP8 / MXFP8, 1/2 for NVFP4 (two E2M1 values a byte)."""

from harness.checks import wire

N = 65536  # elements of the shard


def entry(*inputs):
    return dict(numel=N, inputs=list(inputs))


def test_quantized_bytes_pass():
    log = {"fp8": entry(("uint8", N, N), ("float32", 1, 4)),
           "nvfp4": entry(("uint8", N // 2, N // 2), ("uint8", N // 16, N // 16)),
           "mxfp8": entry(("uint8", N, N), ("uint8", N // 32, N // 32), ("uint8", N, N))}
    assert wire.violations(log, ["fp8"], "current") == []
    assert wire.violations(log, ["nvfp4"], "nvfp4") == []
    assert wire.violations(log, ["mxfp8"], "mxfp8") == []  # rowwise + columnwise data


def test_dequantized_values_fail():
    log = {"w": entry(("float32", N, 4 * N))}
    assert "dequantized values on the wire" in wire.violations(log, ["w"], "current")[0]


def test_nvfp4_unpacked_is_twice_its_bytes():
    """One E2M1 code per byte is 1 B/element: what FP8 moves, twice what NVFP4 must (the old
    rule allowed 1 byte per element for every format)."""
    log = {"w": entry(("uint8", N, N), ("uint8", N // 16, N // 16))}
    assert wire.violations(log, ["w"], "mxfp8") == []
    bad = wire.violations(log, ["w"], "nvfp4")
    assert bad and "more than 0.5 B/element in a data input (nvfp4 moves 0.5)" in bad[0]
    assert "(1 B/element)" in bad[0] or "1.06 B/element" in bad[0]
