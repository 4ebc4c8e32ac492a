"""The CPU comparison's fast path for keys whose two sides hold the same bits
(harness/checks/compare.py ``_equal_stats``) gives the general path's statistics, and only takes
the pairs it can: same bits, every value finite."""

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
    }
    return pairs


FAST = {"f32", "f32_t", "scalar", "f64", "bf16", "f16", "i64", "u8#data", "flag"}


@pytest.mark.parametrize("key", sorted(_pairs()))
def test_fast_path_stats_are_the_general_path_s(key, monkeypatch):
    a, e = _pairs()[key]
    taken = C._equal_stats(a, e) is not None
    assert taken == (key in FAST)  # big64 overflows the float64 square: general path
    fast = C._stats(key, a, e)
    monkeypatch.setattr(C, "_equal_stats", lambda a, e: None)
    general = C._stats(key, a, e)
    assert torch.equal(fast.isnan(), general.isnan())
    torch.testing.assert_close(fast, general, rtol=1e-12, atol=0, equal_nan=True)


def test_compare_gives_the_same_comparison_either_way(monkeypatch):
    pairs = _pairs()
    actual = {k: a for k, (a, _) in pairs.items()}
    expected = {k: e for k, (_, e) in pairs.items()}
    fast = C.compare(actual, expected)
    monkeypatch.setattr(C, "_equal_stats", lambda a, e: None)
    general = C.compare(actual, expected)
    assert (fast.n_diff, fast.n_total, fast.first_diff, fast.problems, fast.nonfinite) == (
        general.n_diff, general.n_total, general.first_diff, general.problems, general.nonfinite)
    assert fast.max_abs == general.max_abs
    assert fast.rel_l2 == pytest.approx(general.rel_l2, rel=1e-12)
    assert fast.n_diff > 0 and fast.nonfinite  # the pairs do exercise both paths
