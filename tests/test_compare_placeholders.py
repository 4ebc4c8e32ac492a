"""Whole tensors live on rank 0 (harness/distributed/gather.py): the other ranks hold meta
placeholders of the same shape and dtype. A comparison there checks keys, shapes and dtypes and
skips the values; rank 0's rows decide when ranks merge (harness/checks/record.py)."""

import torch

from harness.calibration.tolerances import BITWISE
from harness.checks.compare import compare
from harness.checks.record import Recorder, merge
from harness.distributed.gather import held


def _placeholder(t):
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def test_placeholders_skip_values_but_not_keys_shapes_or_dtypes():
    w = torch.randn(8, 4)
    c = compare({"w": _placeholder(w), "local#amax": torch.tensor([2.0])},
                {"w": w + 1.0, "local#amax": torch.tensor([3.0])})
    assert c.problems == [] and c.n_total == 1 and c.n_diff == 1 and c.max_abs == 1.0, c
    for actual, expected, problem in [
            ({"w": _placeholder(w)}, {"w": w[:4]}, "w: shape (8, 4) != (4, 4)"),
            ({"w": _placeholder(w.double())}, {"w": w}, "w: dtype torch.float64 != torch.float32"),
            ({"w": _placeholder(w)}, {"w": w, "v": w}, "missing v"),
            ({"w": _placeholder(w), "w#replicas_diverge(x)": "diverged"}, {"w": w},
             "unexpected w#replicas_diverge(x)")]:
        c = compare(actual, expected)
        assert problem in c.problems and not c.passes(BITWISE), (problem, c)


def test_rank0s_failure_wins_the_merge_over_a_placeholder_pass():
    w = torch.randn(8, 4)
    rank0, rank1 = Recorder(), Recorder()
    rank0.compare("dcp_roundtrip", "state", {"w": w + 1e-3}, {"w": w}, BITWISE)
    rank1.compare("dcp_roundtrip", "state", {"w": _placeholder(w)}, {"w": w}, BITWISE)
    assert all(r["outcome"] == "pass" for r in rank1.rows)
    merged = {r["metric"]: r for r in merge([rank1.rows, rank0.rows])}
    assert merged["n_diff"]["outcome"] == "fail" and merged["n_diff"]["value"] == 32
    assert merged["max_abs"]["rank"] == 1  # the list position of rank 0's rows here


def test_held_tells_placeholders_apart():
    assert held(torch.ones(2)) and held(None) and held("diverged")
    assert not held(torch.empty(2, device="meta"))
