"""Comparisons run where the tensors are (harness/checks/compare.py): on a GPU they give the
same numbers, first differing index and non-finite report as on the CPU (skips without CUDA)."""

import math

import pytest
import torch

from harness.checks.compare import compare


def _states():
    g = torch.Generator().manual_seed(0)
    a = {"w": torch.randn(256, 128, generator=g), "b": torch.randn(7, generator=g),
         "z": torch.tensor([0.0, -0.0]), "n": torch.tensor([math.nan, 1.0, math.inf]),
         "q#data": torch.randint(0, 255, (33,), dtype=torch.uint8, generator=g),
         "bf": torch.randn(10, generator=g).bfloat16(), "flag": torch.tensor([True, False]),
         "empty": torch.empty(0)}
    e = {k: v.clone() for k, v in a.items()}
    e["w"][3, 5] += 1e-3
    e["w"] += 1e-6 * torch.randn(256, 128, generator=g)
    e["z"] = torch.tensor([-0.0, 0.0])
    e["n"] = torch.tensor([math.nan, 2.0, 1.0])
    e["q#data"][4] ^= 3
    e["bf"] = a["bf"].float()
    e["flag"] = torch.tensor([True, True])
    return a, e


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("where", ["both", "actual", "expected"])
def test_gpu_comparison_equals_the_cpu_one(where):
    a, e = _states()
    on_cpu = compare(a, e)
    ga = {k: v.cuda() for k, v in a.items()} if where in ("both", "actual") else a
    ge = {k: v.cuda() for k, v in e.items()} if where in ("both", "expected") else e
    on_gpu = compare(ga, ge)
    assert (on_gpu.n_diff, on_gpu.n_total, on_gpu.first_diff, on_gpu.problems,
            on_gpu.nonfinite) == (on_cpu.n_diff, on_cpu.n_total, on_cpu.first_diff,
                                  on_cpu.problems, on_cpu.nonfinite)
    assert on_gpu.max_abs == on_cpu.max_abs
    assert math.isclose(on_gpu.rel_l2, on_cpu.rel_l2, rel_tol=1e-12) or on_gpu.rel_l2 == on_cpu.rel_l2
    clean = compare({"w": ga["w"]}, {"w": ga["w"].clone()})
    assert (clean.n_diff, clean.max_abs, clean.rel_l2) == (0, 0.0, 0.0)
