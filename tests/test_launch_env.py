"""What a launch's plan and environment carry for the ranks' costs (no processes): DCP's
stager is started up front when the launch may run an async_process save, also when its tasks
come through the feed; the ranks share TorchInductor's caches across launches and keep freed
memory mapped."""

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.launch import launch_dir
from harness.speed import inductor_cache
from harness.launch.feed import FixedFeed
from harness.launch.launch import MALLOC_ENV, Launch
from harness.launch.launch_dir import stager_worlds
from harness.launch.launcher import Launcher, Task
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent


def _cases():
    return expand(load_scenario(ROOT / "scenarios" / "smoke.yaml"))


def _plan(launch: Launch) -> dict:
    return json.loads(launch.plan_path.read_text())


def _launch(launcher: Launcher, tasks: list, world_size: int, timeout_s: float = 60.0) -> Launch:
    """A launch as the launcher makes it (not started): ``tasks`` in its plan, a feed whose
    tasks may have cases of up to ``timeout_s``."""
    feed = FixedFeed([])
    feed.timeout_s = timeout_s
    return launcher._launch(tasks, world_size, {}, feed, retry_start=True)


def test_the_stager_starts_up_front_for_fed_async_process_cases(tmp_path):
    cases = [c for c in _cases()  # async_process saves on world 4 only
             if not (c.ax["dcp"] == "async_process" and c.mesh.world_size == 2)]
    asyncs = {c.mesh.world_size for c in cases if c.ax["dcp"] == "async_process"}
    others = {c.mesh.world_size for c in cases} - asyncs
    assert asyncs and others
    launcher = Launcher(tmp_path, "torch", "cpu")
    launcher.stager_worlds |= stager_worlds(cases)
    assert launcher.stager_worlds == asyncs
    # a launch whose tasks all come through its feed: the run's cases decide
    assert _plan(_launch(launcher, [], min(asyncs)))["stager"]
    assert not _plan(_launch(launcher, [], min(others)))["stager"]
    # a plan's own async_process task decides too
    case = next(c for c in cases if c.ax["dcp"] == "async_process")
    task = Task(f"{case.key}.train", case, "train", tmp_path / "ckpt")
    assert _plan(_launch(Launcher(tmp_path / "b", "torch", "cpu"), [task],
                         case.mesh.world_size))["stager"]
    # a reshard task of such a case only loads: no stager for it
    reshard = next(c for c in cases if c.ax["dcp"] == "async_process" and c.target)
    d = tmp_path / "reshard"
    d.mkdir()
    plan = launch_dir.write_plan(d, [Task(f"{reshard.key}.reshard", reshard, "reshard", d)],
                                 "torch", "cpu", 60.0)
    assert '"stager": false' in plan.read_text()
    d = tmp_path / "plain"
    d.mkdir()
    sync = next(c for c in cases if c.ax["dcp"] == "sync")
    plan = launch_dir.write_plan(d, [Task(f"{sync.key}.train", sync, "train", d)], "torch",
                                 "cpu", 60.0)
    assert '"stager": false' in plan.read_text()


def test_inductor_caches_outlive_a_launch_unless_the_user_chose(tmp_path, monkeypatch):
    none_set = dict.fromkeys(inductor_cache.USER_SETTINGS)
    monkeypatch.setattr(inductor_cache, "USER_SETTINGS", none_set)
    env = inductor_cache.worker_env({"XDG_CACHE_HOME": str(tmp_path)})
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "fsdp2-harness" / "inductor")
    assert Path(env["TORCHINDUCTOR_CACHE_DIR"]).is_dir()
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    mine = {"TORCHINDUCTOR_CACHE_DIR": "/mine", "TORCHINDUCTOR_COMPILE_THREADS": "8"}
    assert inductor_cache.worker_env(mine, extra_env=mine) == {}
    # a value in the environment the user did not set (torch's import wrote its default) is
    # replaced
    torch_default = {"XDG_CACHE_HOME": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": "/tmp/ti_x"}
    assert inductor_cache.worker_env(torch_default)["TORCHINDUCTOR_CACHE_DIR"] == \
        str(tmp_path / "fsdp2-harness" / "inductor")


PROBE = """
import json, os, sys
from harness.launch.launch import run_env  # as the plugin imports it: before torch
import torch._dynamo  # writes Inductor's default cache directory into os.environ
written = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
env = run_env("cpu", json.loads(sys.argv[1]))
print(json.dumps([written, env["TORCHINDUCTOR_CACHE_DIR"], env["TORCHINDUCTOR_COMPILE_THREADS"]]))
"""


def _probe(env: dict, extra: dict) -> list:
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(extra)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_ranks_cache_is_ours_though_torch_wrote_its_default(tmp_path):
    """torch's import writes ``TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor_<user>`` into the
    pytest process's environment; the ranks still get the harness's cache (it was the default
    they used, this one never, before the user's settings were read as the plugin loads)."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_COMPILE_THREADS")}
    base["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    written, got, threads = _probe(base, {})
    assert written and not written.startswith(str(tmp_path))  # torch did write its default
    assert got == str(tmp_path / "xdg" / "fsdp2-harness" / "inductor") and threads == "1"
    # the user's own choices are kept: in the environment, or in a launch's extra environment
    assert _probe({**base, "TORCHINDUCTOR_CACHE_DIR": "/mine"}, {})[1] == "/mine"
    assert _probe(base, {"TORCHINDUCTOR_CACHE_DIR": "/theirs"})[1] == "/theirs"
    assert _probe({**base, "TORCHINDUCTOR_COMPILE_THREADS": "8"}, {})[2] == "8"


def test_a_launch_environment_carries_the_caches(tmp_path):
    launch = _launch(Launcher(tmp_path / "f", "reference", "cpu"), [], 2)
    launch.tmp = str(tmp_path / "tmp")  # the launch's own TMPDIR (made when it starts)
    env = launch._env()
    assert env["TMPDIR"] == launch.tmp
    assert env["TORCHINDUCTOR_CACHE_DIR"] and not env["TORCHINDUCTOR_CACHE_DIR"].startswith(
        launch.tmp)


def test_ranks_keep_freed_memory_unless_the_caller_set_malloc(tmp_path, monkeypatch):
    """glibc's malloc keeps freed large blocks in the ranks (a comparison of 12 x 256K floats
    on this VM: 65 ms -> 13 ms, the page faults of fresh mappings gone); the caller's own
    MALLOC_* settings win."""
    for var in MALLOC_ENV:
        monkeypatch.delenv(var, raising=False)
    launch = _launch(Launcher(tmp_path / "m", "reference", "cpu"), [], 2)
    launch.tmp = str(tmp_path / "tmp")
    env = launch._env()
    assert {k: env[k] for k in MALLOC_ENV} == MALLOC_ENV
    assert int(env["MALLOC_MMAP_THRESHOLD_"]) >= 1 << 30  # a state dict's tensors stay below
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    env = launch._env()
    assert env["MALLOC_TRIM_THRESHOLD_"] == "131072"
    assert env["MALLOC_MMAP_THRESHOLD_"] == MALLOC_ENV["MALLOC_MMAP_THRESHOLD_"]


def test_fed_launches_start_the_stager_up_front_on_gpu_hosts_only(tmp_path):
    """On a 2-core CPU box a stager started before its launch has tasks competed with the busy
    lane (measured slower): the run's cases mark world sizes on cuda only."""
    cases = _cases()
    assert stager_worlds(cases)  # smoke has async_process cases
    for device, expected in (("cuda", stager_worlds(cases)), ("cpu", set())):
        launcher = Launcher(tmp_path / device / "l", "torch", device)
        launcher.expect(cases)
        assert launcher.stager_worlds == expected
