"""Launcher pieces that need no launch: GPU slot packing and how a batch is split over slots."""

import os
from pathlib import Path

from harness.launcher import Launcher, Task, TaskResult
from harness.matrix import expand
from harness.spec import load_scenario

ROOT = Path(__file__).resolve().parent.parent


def test_slots_pack_world_size_chunks_of_visible_gpus(tmp_path):
    launcher = Launcher(tmp_path, "te", "cuda", gpus=["3", "4", "5", "6", "7"])
    assert launcher.slots(2) == [{"CUDA_VISIBLE_DEVICES": "3,4"}, {"CUDA_VISIBLE_DEVICES": "5,6"}]
    assert launcher.slots(4) == [{"CUDA_VISIBLE_DEVICES": "3,4,5,6"}]
    assert Launcher(tmp_path, "torch", "cpu").slots(2) == [{}]


def test_batch_is_spread_over_slots_keeping_each_case_together(tmp_path, monkeypatch):
    cases = [c for c in expand(load_scenario(ROOT / "scenarios" / "smoke.yaml"))
             if c.world_sizes[0] == 4]
    tasks = []
    for c in cases:
        tasks.append(Task(f"{c.key}.train", c, "train", tmp_path))
        if c.target and c.target.world_size == 4:
            tasks.append(Task(f"{c.key}.reshard", c, "reshard", tmp_path))
    launcher = Launcher(tmp_path, "torch", "cuda", gpus=[str(i) for i in range(8)])
    seen = []

    def fake_chunk(chunk, world, env):
        seen.append((env["CUDA_VISIBLE_DEVICES"], [t.name for t in chunk]))
        return {t.name: TaskResult(t.name, "ok") for t in chunk}

    monkeypatch.setattr(launcher, "_run_chunk", fake_chunk)
    results = launcher.run_batch(tasks, 4)
    assert set(results) == {t.name for t in tasks}
    assert sorted(env for env, _ in seen) == ["0,1,2,3", "4,5,6,7"]
    for _, names in seen:  # train and reshard of one case never split across launches
        keys = {n.rsplit(".", 1)[0] for n in names}
        for k in keys:
            assert all(t.name in names for t in tasks if t.case.key == k)


def test_workers_cache_bytecode_where_it_cannot_sit_beside_the_sources(tmp_path):
    """PYTHONDONTWRITEBYTECODE (containers) would make every rank of every launch compile
    torch again: the workers get a bytecode prefix dir instead; a user's own prefix is kept,
    and a normal install (bytecode beside the sources) is left alone."""
    import importlib.util

    import torch

    from harness.bytecode import worker_env as bytecode_cache
    env = {"PYTHONDONTWRITEBYTECODE": "1", "XDG_CACHE_HOME": str(tmp_path)}
    got = bytecode_cache(env)
    assert got == {"PYTHONPYCACHEPREFIX": str(tmp_path / "fsdp2-harness" / "pycache"),
                   "PYTHONDONTWRITEBYTECODE": ""}
    assert (tmp_path / "fsdp2-harness" / "pycache").is_dir()
    assert bytecode_cache({**env, "PYTHONPYCACHEPREFIX": "/mine"}) == {}
    if os.path.exists(importlib.util.cache_from_source(torch.__file__)):
        assert bytecode_cache({"XDG_CACHE_HOME": str(tmp_path)}) == {}


def test_pytest_itself_caches_bytecode_where_it_cannot_sit_beside_the_sources(tmp_path):
    """The pytest process turns the same cache on for itself before torch is imported (on the
    GPU box 5.8 s of a 12 s ``--collect-only`` was compiling torch and TE); not where bytecode
    works, and never over a prefix the user chose."""
    import subprocess
    import sys
    code = ("import sys; from harness import bytecode; "
            "print(bytecode.use_here(), sys.pycache_prefix, sys.dont_write_bytecode)")

    def run(**env):
        base = {k: v for k, v in os.environ.items()
                if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**base, "XDG_CACHE_HOME": str(tmp_path), **env}, cwd=ROOT,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert run(PYTHONDONTWRITEBYTECODE="1") == [
        "True", str(tmp_path / "fsdp2-harness" / "pycache"), "False"]
    assert run(PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX="/mine")[0] == "False"
    from harness import bytecode
    if bytecode._torch_has_bytecode():
        assert run() == ["False", "None", "False"]
