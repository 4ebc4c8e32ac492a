import math

import pytest
import torch

from harness import tolerances
from harness.checks.compare import compare
from harness.tolerances import BITWISE, MissingTolerance, Tolerance


def test_lookup_table_and_bitwise():
    t = tolerances.lookup("fp32_parity", "params", "bf16")
    assert t.rel_l2 > 0 and "bf16" in t.reason
    assert tolerances.lookup("dcp_roundtrip", "state", "bf16") is BITWISE
    assert tolerances.lookup("reshard", "state", "fp32") is BITWISE


def test_override_applies_but_never_to_bitwise():
    o = {"fp32_parity": {"fp32": {"max_abs": 1, "rel_l2": 2, "reason": "why"}},
         "dcp_roundtrip": {"fp32": {"max_abs": 1, "rel_l2": 1, "reason": "nope"}}}
    assert tolerances.lookup("fp32_parity", "loss", "fp32", o) == Tolerance(1.0, 2.0, "why")
    assert tolerances.lookup("dcp_roundtrip", "state", "fp32", o) is BITWISE


def test_missing_is_an_error():
    with pytest.raises(MissingTolerance, match="add one with its reason"):
        tolerances.lookup("fp32_parity", "loss", "nvfp4-unknown")


def test_every_tolerance_has_a_reason():
    for row in tolerances.table():
        assert len(row["reason"]) > 20, row


def test_compare_reports_max_abs_rel_l2_and_first_index():
    e = {"a": torch.zeros(3, 4), "b": torch.ones(5)}
    a = {"a": torch.zeros(3, 4), "b": torch.ones(5)}
    a["a"][1, 2] = 0.5
    a["a"][2, 3] = -0.25
    c = compare(a, e)
    assert c.max_abs == 0.5 and c.n_diff == 2 and c.n_total == 17
    assert math.isclose(c.rel_l2, math.sqrt(0.25 + 0.0625) / math.sqrt(5))
    assert c.first_diff.startswith("a[1, 2]: 0.5 vs 0")
    assert not c.passes(BITWISE) and c.passes(Tolerance(0.5, 1.0, "x"))
    assert not c.passes(Tolerance(0.4, 1.0, "x"))


def test_bitwise_sees_negative_zero_and_nan_payloads():
    c = compare({"x": torch.tensor([-0.0])}, {"x": torch.tensor([0.0])})
    assert c.max_abs == 0 and c.n_diff == 1 and not c.passes(BITWISE)
    assert c.passes(Tolerance(0, 0.1, "values equal"))  # equal values, only bits differ
    nan = torch.tensor([float("nan")])
    assert compare({"x": nan}, {"x": nan.clone()}).passes(BITWISE)
    c = compare({"x": nan}, {"x": torch.tensor([1.0])})
    assert c.max_abs == math.inf and not c.passes(Tolerance(1e9, 1e9, "x"))


def test_structure_problems_fail():
    c = compare({"a": torch.zeros(2), "extra": torch.zeros(1)}, {"a": torch.zeros(3), "b": torch.zeros(1)})
    assert c.problems == ["missing b", "unexpected extra", "a: shape (2,) != (3,)"]
    assert not c.passes(Tolerance(1, 1, "x"))
    c = compare({"a": torch.zeros(2)}, {"a": torch.zeros(2, dtype=torch.float64)})
    assert "dtype" in c.problems[0]
    c = compare({"lr": 0.1, "s": torch.tensor(3)}, {"lr": 0.2, "s": torch.tensor(3)})
    assert c.problems == ["lr: 0.1 != 0.2"]


def test_empty_tensors_compare_equal():
    e = torch.empty(0, dtype=torch.uint8)
    c = compare({"x": e, "y": torch.ones(2)}, {"x": e.clone(), "y": torch.ones(2)})
    assert c.passes(BITWISE) and c.n_total == 2
