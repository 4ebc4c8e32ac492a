"""The FP32 reference cache keys on everything that determines the reference."""

import dataclasses

import pytest

from harness.backends import get
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario
from harness.worker import reference_cache


@pytest.fixture
def case(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("name: s\naxes: {recipe: [fp32], mesh: [dp2, dp2xtp2], module: [LayerNormMLP,"
                 " Linear], dcp: [sync, async_thread], reshard: [none]}\n")
    return expand(load_scenario(p))


def test_cases_that_share_a_reference_share_the_key(case):
    torch_backend = get("torch")
    keys = {c.ax["module"]: set() for c in case}
    for c in case:
        keys[c.ax["module"]].add(reference_cache.key(c, torch_backend, "cpu", 1.0))
    # mesh and DCP mode do not change the single-process reference: one key per module
    assert all(len(k) == 1 for k in keys.values()) and len(set().union(*keys.values())) == 2


@pytest.mark.parametrize("change", ["module", "hidden", "seed", "steps", "lr", "lr_scale",
                                    "device", "backend"])
def test_any_determinant_changes_the_key(case, change):
    c, backend, device, scale = case[0], get("torch"), "cpu", 1.0
    base = reference_cache.key(c, backend, device, scale)
    if change == "module":
        c = next(x for x in case if x.ax["module"] != c.ax["module"])
    elif change == "hidden":
        c = dataclasses.replace(c, model=dataclasses.replace(c.model, hidden=c.model.hidden * 2))
    elif change in ("seed", "steps", "lr"):
        v = getattr(c.train, change)
        c = dataclasses.replace(c, train=dataclasses.replace(c.train, **{change: v * 2 + 1}))
    elif change == "lr_scale":
        scale = 1.01
    elif change == "device":
        device = "cuda"
    elif change == "backend":
        backend = get("reference")
    assert reference_cache.key(c, backend, device, scale) != base
