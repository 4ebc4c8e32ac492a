"""The CPU comparison's fast paths give the general path's statistics and only take the pairs
they can (harness/checks/compare.py): ``_equal_stats`` for keys whose two sides hold the same
bits, ``_finite_stats`` for keys whose bits differ -- both with every value finite. The first
differing element is named the same either way."""

import math

import pytest
import torch

from harness.checks import compare as C


def _with(t, index, value):
    t = t.clone()
    t[index] = value
    return t


def _pairs():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 48, generator=g)
    same = {"f32": w, "f32_t": w.t(), "scalar": torch.tensor(3.5), "f64": w.double(),
            "bf16": w.bfloat16(), "f16": w.half(), "i64": torch.arange(-9, 99),
            "u8#data": torch.randint(0, 255, (77,), dtype=torch.uint8, generator=g),
            "flag": torch.tensor([True, False, True]), "big64": torch.tensor([1e200, 2.0],
                                                                               dtype=torch.float64)}
    pairs = {k: (v, v.clone()) for k, v in same.items()}
    pairs |= {  # not for the fast path: bits differ, or a value is not finite
        "zeros": (torch.tensor([0.0, -0.0]), torch.tensor([-0.0, 0.0])),
        "nan": (torch.tensor([math.nan, 1.0]), torch.tensor([math.nan, 1.0])),
        "inf": (torch.tensor([math.inf, 1.0]), torch.tensor([math.inf, 1.0])),
        "pad#scale_inv": (torch.tensor([2.0, math.nan]), torch.tensor([2.0, math.nan])),
        "moved": (w, w + 1e-3), "one_value": (w, _with(w, (3, 5), 2.0)),
        "bf16_moved": (w.bfloat16(), (w + 0.05).bfloat16()),
        "f32_t_moved": (w.t(), (w + 1e-3).t()),
        "i64_moved": (torch.arange(-9, 99), _with(torch.arange(-9, 99), 7, 1000)),
        "inf_one_side": (_with(w, (0, 1), math.inf), w),
        "nan_one_side": (w, _with(w, (2, 2), math.nan)),
        "big64_moved": (torch.tensor([1e200, 2.0], dtype=torch.float64),
                        torch.tensor([-1e200, 2.0], dtype=torch.float64)),
        "flag_moved": (torch.tensor([True, False]), torch.tensor([True, True])),
    }
    return pairs


FAST = {"f32", "f32_t", "scalar", "f64", "bf16", "f16", "i64", "u8#data", "flag"}
# bits differ, every value finite (-0.0 vs 0.0 differ in bits, by 0)
FINITE = {"zeros", "moved", "one_value", "bf16_moved", "f32_t_moved", "i64_moved"}


@pytest.mark.parametrize("key", sorted(_pairs()))
def test_fast_path_stats_are_the_general_path_s(key, monkeypatch):
    a, e = _pairs()[key]
    taken = C._equal_stats(a, e) is not None
    assert taken == (key in FAST)  # big64 overflows the float64 square: general path
    assert (C._finite_stats(a, e) is not None) == (key in FINITE) or taken
    fast = C._stats(key, a, e)
    _general_only(monkeypatch)
    general = C._stats(key, a, e)
    assert torch.equal(fast.isnan(), general.isnan())
    torch.testing.assert_close(fast, general, rtol=1e-12, atol=0, equal_nan=True)


def _general_only(monkeypatch):
    monkeypatch.setattr(C, "_equal_stats", lambda a, e: None)
    monkeypatch.setattr(C, "_finite_stats", lambda a, e: None)


@pytest.mark.parametrize("key", sorted(k for k, (a, e) in _pairs().items()
                                       if not C.bits(a).equal(C.bits(e))))
def test_the_first_differing_element_is_the_first_differing_bytes(key):
    """``_differs`` compares same-width integers; the first element whose bytes differ."""
    a, e = _pairs()[key]
    ne = (C.bits(a).reshape(a.numel(), -1) != C.bits(e).reshape(e.numel(), -1)).any(dim=1)
    assert torch.equal(C._differs(a, e, None, None), ne)
    i = int(ne.nonzero()[0])
    fa, fe = a.reshape(-1).double(), e.reshape(-1).double()
    want = f"{key}{C._index(i, tuple(a.shape))}: {fa[i].item():.9g} vs {fe[i].item():.9g}"
    assert C._first(key, a, e) == want


def test_compare_gives_the_same_comparison_either_way(monkeypatch):
    pairs = _pairs()
    actual = {k: a for k, (a, _) in pairs.items()}
    expected = {k: e for k, (_, e) in pairs.items()}
    fast = C.compare(actual, expected)
    _general_only(monkeypatch)
    general = C.compare(actual, expected)
    assert (fast.n_diff, fast.n_total, fast.first_diff, fast.problems, fast.nonfinite) == (
        general.n_diff, general.n_total, general.first_diff, general.problems, general.nonfinite)
    assert fast.max_abs == general.max_abs
    assert fast.rel_l2 == pytest.approx(general.rel_l2, rel=1e-12)
    assert fast.n_diff > 0 and fast.nonfinite  # the pairs do exercise both paths
