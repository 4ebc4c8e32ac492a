"""What a launch's plan and environment carry for the ranks' start-up costs (no processes):
DCP's stager is started up front when the launch may run an async_process save, also when
its tasks come through the feed; the ranks share TorchInductor's caches across launches; a
forked rank's agent imports the backend's library."""

import json
from pathlib import Path

from harness import inductor_cache, launch_dir
from harness.execution import Execution
from harness.fork_agent import PRELOAD_BACKEND_VAR
from harness.launch import Launch, _env
from harness.launch_dir import stager_worlds
from harness.launcher import Launcher, Task
from harness.matrix import expand
from harness.spec import load_scenario

ROOT = Path(__file__).resolve().parent.parent


def _cases():
    return expand(load_scenario(ROOT / "scenarios" / "smoke.yaml"))


def _plan(launch: Launch) -> dict:
    return json.loads(launch.plan_path.read_text())


def test_the_stager_starts_up_front_for_fed_async_process_cases(tmp_path):
    cases = [c for c in _cases()  # async_process saves on world 4 only
             if not (c.ax["dcp"] == "async_process" and c.mesh.world_size == 2)]
    asyncs = {c.mesh.world_size for c in cases if c.ax["dcp"] == "async_process"}
    others = {c.mesh.world_size for c in cases} - asyncs
    assert asyncs and others
    launcher = Launcher(tmp_path, "torch", "cpu")
    launcher.stager_worlds |= stager_worlds(cases)
    assert launcher.stager_worlds == asyncs
    # an early launch has no task in its plan: the run's cases decide
    assert _plan(Launch(launcher, [], min(asyncs), {}, timeout_s=60, early=True))["stager"]
    assert not _plan(Launch(launcher, [], min(others), {}, timeout_s=60, early=True))["stager"]
    # a plan's own async_process task decides too
    case = next(c for c in cases if c.ax["dcp"] == "async_process")
    task = Task(f"{case.key}.train", case, "train", tmp_path / "ckpt")
    assert _plan(Launch(Launcher(tmp_path / "b", "torch", "cpu"), [task],
                        case.mesh.world_size, {}))["stager"]
    d = tmp_path / "plain"
    d.mkdir()
    sync = next(c for c in cases if c.ax["dcp"] == "sync")
    plan = launch_dir.write_plan(d, [Task(f"{sync.key}.train", sync, "train", d)], "torch",
                                 "cpu", 60.0)
    assert '"stager": false' in plan.read_text()


def test_inductor_caches_outlive_a_launch_unless_the_user_chose(tmp_path):
    env = inductor_cache.worker_env({"XDG_CACHE_HOME": str(tmp_path)})
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "fsdp2-harness" / "inductor")
    assert Path(env["TORCHINDUCTOR_CACHE_DIR"]).is_dir()
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    mine = {"TORCHINDUCTOR_CACHE_DIR": "/mine", "TORCHINDUCTOR_COMPILE_THREADS": "8"}
    assert inductor_cache.worker_env(mine) == {}


def test_a_launch_environment_carries_the_caches_and_the_backend_to_preload(tmp_path):
    fork = Launcher(tmp_path / "f", "reference", "cpu", rank_start="fork", agent_server=False)
    launch = Launch(fork, [], 2, {}, timeout_s=60, early=True)
    launch.tmp = str(tmp_path / "tmp")  # the launch's own TMPDIR (made when it starts)
    env = _env(launch)
    assert env[PRELOAD_BACKEND_VAR] == "reference"
    assert env["TORCHINDUCTOR_CACHE_DIR"] and not env["TORCHINDUCTOR_CACHE_DIR"].startswith(
        launch.tmp)
    fresh = Launcher(tmp_path / "r", "reference", "cpu", rank_start="fresh")
    launch = Launch(fresh, [], 2, {}, timeout_s=60, early=True)
    launch.tmp = str(tmp_path / "tmp2")
    assert PRELOAD_BACKEND_VAR not in _env(launch)


def test_fed_launches_start_the_stager_up_front_on_gpu_hosts_only(tmp_path):
    """On a 2-core CPU box a stager started before its launch has tasks competed with the busy
    lane (measured slower): the run's cases mark world sizes on cuda only."""
    cases = _cases()
    assert stager_worlds(cases)  # smoke has async_process cases
    for device, expected in (("cuda", stager_worlds(cases)), ("cpu", set())):
        ex = Execution("t", str(tmp_path / device))
        ex.launcher = Launcher(tmp_path / device / "l", "torch", device, agent_server=False)
        ex._expect(cases)
        assert ex.launcher.stager_worlds == expected
