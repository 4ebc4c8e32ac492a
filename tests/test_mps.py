"""The run's own MPS server (harness/launch/mps.py) against a stand-in for
nvidia-cuda-mps-control (no GPU here): it starts where it can apply and says why not where it
cannot, its daemon is gone when the run stops it -- asked to quit, or killed when it does not --
a killed run's daemon is stopped by the next run, and only the ranks sharing a GPU are its
clients (stagers and NCCL ranks leave it)."""

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from harness.launch import mps
from harness.plugin import execution
from harness.worker.stager_fork import leave_run_mps

FAKE = r'''#!{python}
import os, sys, time
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
if sys.argv[1:] == ["-d"]:
    if os.environ.get("FAKE_MPS_FAIL"):
        print("no GPU for MPS"); sys.exit(3)
    if os.fork() == 0:  # the daemon, as -d leaves it: a session of its own
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        open(os.path.join(pipe, "control"), "w").close()
        while not os.path.exists(os.path.join(pipe, "quit")):
            time.sleep(0.02)
        if os.environ.get("FAKE_MPS_IGNORE_QUIT"):
            time.sleep(600)
        os._exit(0)
    sys.exit(0)
if sys.stdin.read().strip() == "quit":
    open(os.path.join(pipe, "quit"), "w").close()
'''


@pytest.fixture
def control(tmp_path):
    path = tmp_path / "bin" / mps.CONTROL
    path.parent.mkdir()
    path.write_text(FAKE.replace("{python}", sys.executable))
    path.chmod(0o755)
    return str(path)


def _start(control, tmp_path, **env):
    return mps.start({"PATH": os.environ["PATH"], **env}, 42, 1, control=control,
                     modes=["Default"], tmp=str(tmp_path))


def test_the_daemon_starts_serves_the_launches_and_is_gone_after_stop(control, tmp_path):
    server, state = _start(control, tmp_path)
    assert server is not None, state
    assert state.startswith("a server of the run's own") and str(server.pipe) in state
    assert server.env() == {mps.PIPE_VAR: str(server.pipe), mps.LOG_VAR: str(server.log)}
    daemons = mps.holders(server.pipe)
    assert len(daemons) == 1
    assert server.stop() == ""  # it quit when asked
    assert mps.holders(server.pipe) == [] and not server.root.exists()
    assert not os.path.exists(f"/proc/{daemons[0]}") or \
        open(f"/proc/{daemons[0]}/stat").read().split()[2] == "Z"


def test_a_daemon_that_does_not_quit_is_killed_within_the_bound(control, tmp_path, monkeypatch):
    monkeypatch.setattr(mps, "STEP_S", 1.0)
    server, state = _start(control, tmp_path, FAKE_MPS_IGNORE_QUIT="1")
    assert server is not None, state
    (pid,) = mps.holders(server.pipe)
    t0 = time.monotonic()
    said = server.stop()
    assert said == f"killed MPS pids {pid} after quit"
    assert time.monotonic() - t0 < 5 and mps.holders(server.pipe) == []


def test_a_daemon_that_cannot_start_leaves_the_run_without_mps(control, tmp_path):
    server, state = _start(control, tmp_path, FAKE_MPS_FAIL="1")
    assert server is None
    assert state.startswith("off: nvidia-cuda-mps-control -d exited 3") and "no GPU" in state
    assert not list(tmp_path.glob("harness-mps-*"))  # nothing left behind


@pytest.mark.parametrize("env, control, modes, per_gpu, why", [
    ({mps.PIPE_VAR: "/theirs"}, "c", ["Default"], 8, "the caller's own MPS"),
    ({}, None, ["Default"], 8, "no nvidia-cuda-mps-control"),
    ({}, "c", None, 8, "cannot tell the GPUs' compute mode"),
    ({}, "c", ["Default", "Exclusive_Process"], 8, "compute mode is not Default"),
    ({}, "c", ["Default"], 49, "49 ranks a GPU, more than MPS's 48"),
])
def test_where_it_cannot_apply_the_run_says_why(env, control, modes, per_gpu, why):
    assert why in mps.why_not(env, control, modes, per_gpu)
    assert mps.why_not({}, "c", ["Default"], 48) is None


def test_the_rank_bound_gives_the_ranks_a_gpu():
    assert mps.ranks_per_gpu(42, 1) == 42 and mps.ranks_per_gpu(42, 2) == 21
    assert mps.ranks_per_gpu(0, 1) > mps.MAX_CLIENTS  # no bound: too many for MPS


def test_a_killed_runs_daemon_is_stopped_by_the_next_run(control, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    root = tmp_path / f"harness-mps-p{dead.pid}-abcd1234"
    (root / "pipe").mkdir(parents=True)
    (root / "log").mkdir()
    env = {**os.environ, mps.PIPE_VAR: str(root / "pipe")}
    subprocess.run([control, "-d"], env=env, timeout=10, check=True)
    deadline = time.monotonic() + 10
    while not mps.holders(root / "pipe") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mps.holders(root / "pipe")
    os.environ["PATH"] = f"{os.path.dirname(control)}:{os.environ['PATH']}"
    try:
        assert mps.sweep([tmp_path]) == 1
    finally:
        os.environ["PATH"] = os.environ["PATH"].split(":", 1)[1]
    assert mps.holders(root / "pipe") == [] and not root.exists()


def test_only_ranks_sharing_a_gpu_are_clients_of_the_runs_server():
    ours = {mps.PIPE_VAR: "/tmp/harness-mps-p1-abcd1234/pipe", "X": "1"}
    assert leave_run_mps(dict(ours)) == {"X": "1"}  # stagers, NCCL ranks
    theirs = {mps.PIPE_VAR: "/var/run/nvidia-mps"}
    assert leave_run_mps(dict(theirs)) == theirs  # the caller's own MPS stays as it is


def _hs(device):
    opts = {"work_dir": None, "launches_per_gpu": None, "nnodes": 1, "rdzv_endpoint": None,
            "node_launcher": None, "gpu_share": "auto", "rank_start": "auto",
            "accelerations": "all", "max_ranks": None, "collectonly": False}
    return SimpleNamespace(device=device, worker_id=None, config=SimpleNamespace(
        getoption=opts.get, cache={}, option=SimpleNamespace(numprocesses=None)),
        env=SimpleNamespace(visible_gpus=lambda: ["0"] if device == "cuda" else []))


def test_a_cpu_run_has_no_mps():
    hs = _hs("cpu")
    assert "mps" not in execution.accelerations(hs)
    assert execution.mps_for(hs) == (None, "off: not a GPU run")
