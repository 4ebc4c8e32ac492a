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


def test_workers_cache_bytecode_where_it_cannot_sit_beside_the_sources(tmp_path, monkeypatch):
    """PYTHONDONTWRITEBYTECODE (containers) would make every rank of every launch compile
    torch again: the workers get a bytecode prefix dir instead; a user's own prefix is kept,
    and a normal install (bytecode beside the sources) is left alone."""
    from harness import bytecode
    cache = str(tmp_path / "fsdp2-harness" / "pycache")
    env = {"PYTHONDONTWRITEBYTECODE": "1", "XDG_CACHE_HOME": str(tmp_path)}
    for compiled in (True, False):  # an install that compiled torch or one that did not (uv)
        monkeypatch.setattr(bytecode, "_torch_has_bytecode", lambda: compiled)
        assert bytecode.worker_env(env) == {"PYTHONPYCACHEPREFIX": cache,
                                            "PYTHONDONTWRITEBYTECODE": ""}
        assert bytecode.worker_env({**env, "PYTHONPYCACHEPREFIX": "/mine"}) == {}
    assert (tmp_path / "fsdp2-harness" / "pycache").is_dir()
    monkeypatch.setattr(bytecode, "_torch_has_bytecode", lambda: True)
    assert bytecode.worker_env({"XDG_CACHE_HOME": str(tmp_path)}) == {}  # a normal install
    # no bytecode beside torch (installed without compiling), writing allowed: the cache too
    monkeypatch.setattr(bytecode, "_torch_has_bytecode", lambda: False)
    assert bytecode.worker_env({"XDG_CACHE_HOME": str(tmp_path)}) == {"PYTHONPYCACHEPREFIX": cache}


def test_bytecode_beside_the_sources_is_not_the_cache_s_copy(tmp_path, monkeypatch):
    """Whether torch was installed with its bytecode is decided beside its sources, also in a
    process (pytest) whose own bytecode already goes to the harness's cache."""
    import importlib.util
    import sys

    from harness import bytecode
    src = tmp_path / "pkg" / "__init__.py"
    src.parent.mkdir()
    src.write_text("")
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "cache"))
    cached = Path(importlib.util.cache_from_source(str(src)))
    assert cached.is_relative_to(tmp_path / "cache")
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"")
    assert not bytecode.has_bytecode_beside(str(src))
    monkeypatch.setattr(sys, "pycache_prefix", None)
    beside = Path(importlib.util.cache_from_source(str(src)))
    beside.parent.mkdir()
    beside.write_bytes(b"")
    assert bytecode.has_bytecode_beside(str(src))


def test_pytest_itself_caches_bytecode_where_it_cannot_sit_beside_the_sources(tmp_path):
    """The pytest process turns the same cache on for itself before torch is imported (on the
    GPU box 5.8 s of a 12 s ``--collect-only`` was compiling torch and TE); not where bytecode
    works, and never over a prefix the user chose."""
    import subprocess
    import sys
    code = ("import sys; from harness import bytecode; {}"
            "print(bytecode.use_here(), sys.pycache_prefix, sys.dont_write_bytecode)")

    def run(compiled=None, **env):  # compiled: whether torch's install compiled its bytecode
        base = {k: v for k, v in os.environ.items()
                if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
        pretend = "" if compiled is None else f"bytecode._torch_has_bytecode = lambda: {compiled}; "
        out = subprocess.run([sys.executable, "-c", code.format(pretend)], capture_output=True,
                             text=True, env={**base, "XDG_CACHE_HOME": str(tmp_path), **env},
                             cwd=ROOT, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    cache = str(tmp_path / "fsdp2-harness" / "pycache")
    assert run(PYTHONDONTWRITEBYTECODE="1") == ["True", cache, "False"]
    assert run(PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX="/mine")[0] == "False"
    assert run(compiled=True) == ["False", "None", "False"]  # a normal install: left alone
    assert run(compiled=False) == ["True", cache, "False"]
