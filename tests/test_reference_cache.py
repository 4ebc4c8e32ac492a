"""The FP32 reference cache keys on everything that determines the reference."""

import dataclasses

import pytest
import torch

from harness.backends import get
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario
from harness.speed import reference_cache


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


def test_a_full_work_dir_says_enospc_and_names_the_directory(tmp_path, monkeypatch):
    # torch.save straight to a full disk said RuntimeError('[enforce fail at
    # inline_container.cc:672] . unexpected pos 128 vs 0')
    import errno
    import os
    from pathlib import Path

    import torch
    from diskfull import full_dir

    with full_dir(tmp_path) as (full, how):
        if how == "fake":
            def no_space(self, data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
            monkeypatch.setattr(Path, "write_bytes", no_space)
        with pytest.raises(OSError) as e:
            reference_cache.store((torch.zeros(1 << 18),), full / "ref" / "k.pt")
        left = sorted(p.name for p in full.rglob("*"))
    assert str(e.value) == (f"[Errno 28] no space left on device in {full / 'ref'} (the work "
                            f"directory's cache of FP32 reference and one-rank twin runs)"), \
        how
    assert left in ([], ["filler"], ["filler", "ref"], ["ref"]), left  # no half-written file


def test_rank0_computes_in_a_library_state_of_its_own(tmp_path, monkeypatch):
    """A run rank 0 makes alone runs inside ``backend.isolated()`` (TE: its own global FP8
    state; before, LlamaStack's FP32 reference after a DelayedScaling step reduced the case's
    amax buffers over the world on rank 0 alone and hung); a cached one is only read."""
    import contextlib
    from types import SimpleNamespace

    import torch.distributed as dist
    monkeypatch.setattr(dist, "broadcast_object_list", lambda objs, src, group: None)
    monkeypatch.setattr(dist, "all_gather_object", lambda out, obj, group: out.__setitem__(0, obj))
    events = []

    class Backend:
        @contextlib.contextmanager
        def isolated(self):
            events.append("enter")
            try:
                yield
            finally:
                events.append("exit")

    ctx = SimpleNamespace(rank=0, world_size=1, backend=Backend(), exchange=None)

    def compute():
        events.append("compute")
        return [1.0, 2.0], torch.ones(3)

    losses, t = reference_cache.cached(tmp_path, "k", compute, ctx)
    assert events == ["enter", "compute", "exit"] and losses == [1.0, 2.0]
    events.clear()
    _, again = reference_cache.cached(tmp_path, "k", compute, ctx)
    assert events == [] and torch.equal(again, t)

    def broken():
        raise ValueError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        reference_cache.cached(tmp_path, "other", broken, ctx)
    assert events == ["enter", "exit"]
