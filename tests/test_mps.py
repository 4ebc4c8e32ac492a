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
from harness.worker import mps_client

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
    return mps.start({"PATH": os.environ["PATH"], **env}, control=control, modes=["Default"],
                     tmp=str(tmp_path))


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


@pytest.mark.parametrize("env, control, modes, why", [
    ({mps.PIPE_VAR: "/theirs"}, "c", ["Default"], "the caller's own MPS"),
    ({}, None, ["Default"], "no nvidia-cuda-mps-control"),
    ({}, "c", None, "cannot tell the GPUs' compute mode"),
    ({}, "c", ["Default", "Exclusive_Process"], "compute mode is not Default"),
])
def test_where_it_cannot_apply_the_run_says_why(env, control, modes, why):
    assert why in mps.why_not(env, control, modes)
    assert mps.why_not({}, "c", ["Default", "Default"]) is None


def test_more_ranks_a_gpu_than_mps_takes_is_too_many():
    assert mps.too_many(48, 1) is None and mps.too_many(96, 2) is None
    assert "49 ranks a GPU at once, more than MPS's 48" in mps.too_many(49, 1)
    assert "49 ranks" in mps.too_many(97, 2)


def test_the_daemon_sees_every_gpu_whatever_the_callers_visible_devices(control, tmp_path):
    """The launches name GPUs by the host's numbers; a server under the caller's
    CUDA_VISIBLE_DEVICES would number them from 0."""
    server, state = _start(control, tmp_path, CUDA_VISIBLE_DEVICES="2,3")
    assert server is not None, state
    try:
        (pid,) = mps.holders(server.pipe)
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        assert not any(e.startswith(b"CUDA_VISIBLE_DEVICES=") for e in env)
    finally:
        server.stop()


def test_a_killed_runs_daemon_is_stopped_by_the_next_run(control, tmp_path, monkeypatch):
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
    monkeypatch.setenv("PATH", f"{os.path.dirname(control)}:{os.environ['PATH']}")
    assert mps.sweep([tmp_path]) == 1
    assert mps.holders(root / "pipe") == [] and not root.exists()


def test_what_a_rank_starts_leaves_the_runs_server_but_not_the_callers():
    ours = {mps.PIPE_VAR: "/tmp/harness-mps-p1-abcd1234/pipe", "X": "1"}
    assert mps_client.leave(dict(ours)) == {"X": "1"}  # stagers, NCCL ranks
    theirs = {mps.PIPE_VAR: "/var/run/nvidia-mps"}
    assert mps_client.leave(dict(theirs)) == theirs  # the caller's own MPS stays as it is
    # the server's directory carries the mark the ranks look for
    assert mps_client.PIPE_VAR == mps.PIPE_VAR
    assert ("/" + mps.scratch.prefix("mps")).startswith(mps_client.MARK)


def test_the_run_stops_its_server_even_where_the_rank_server_will_not():
    from harness.plugin import hooks
    from harness.plugin.items import STASH

    stopped = []

    def broken():
        raise RuntimeError("rank server stuck")
    hs = SimpleNamespace(sigterm_handler=None, rank_server=SimpleNamespace(stop=broken),
                         mps=SimpleNamespace(stop=lambda: stopped.append("mps")))
    with pytest.raises(RuntimeError, match="stuck"):
        hooks.pytest_unconfigure(SimpleNamespace(stash={STASH: hs}))
    assert stopped == ["mps"]


def _hs(device, tmp_path=None, numprocesses=None, **given):
    opts = {"work_dir": str(tmp_path / "work") if tmp_path else None, "launches_per_gpu": None,
            "nnodes": 1, "rdzv_endpoint": None, "node_launcher": None, "gpu_share": "auto",
            "rank_start": "auto", "accelerations": "all", "max_ranks": None,
            "collectonly": False, **given}
    return SimpleNamespace(
        device=device, worker_id=None, run_id="r1", backend="te", rank_server=None, mps=None,
        config=SimpleNamespace(getoption=opts.get, cache=None,
                               option=SimpleNamespace(numprocesses=numprocesses)),
        env=SimpleNamespace(visible_gpus=lambda: ["0"] if device == "cuda" else []),
        record=SimpleNamespace(report_dir=tmp_path / "reports" if tmp_path else None,
                               on_launch=lambda r: None))


def test_runs_that_start_no_server():
    hs = _hs("cpu")
    assert "mps" not in execution.accelerations(hs)
    assert execution.mps_for(hs) == (None, "off: not a GPU run")
    assert execution.mps_for(_hs("cuda", accelerations="all,-mps")) == \
        (None, "off: --accelerations")
    for quiet in (_hs("cuda", collectonly=True), _hs("cuda", numprocesses=2)):
        assert execution.mps_for(quiet) == (None, "off: this process runs no launch")


def test_the_launches_get_the_servers_env_unless_their_ranks_are_too_many(tmp_path):
    hs = _hs("cuda", tmp_path)
    hs.mps = mps.Server(tmp_path / "harness-mps-p1-abcd1234", "control")
    ex = execution.Execution.for_run(hs)
    try:
        assert mps.PIPE_VAR in ex.launcher.extra_env and mps.LOG_VAR in ex.launcher.extra_env
        ex.launcher.peak_ranks = lambda: 48
        ex._fit_mps()
        assert ex.launcher.extra_env[mps.PIPE_VAR] == str(hs.mps.pipe) and ex.mps_state == ""
        ex.launcher.peak_ranks = lambda: 50
        ex._fit_mps()
        assert mps.PIPE_VAR not in ex.launcher.extra_env
        assert mps.LOG_VAR not in ex.launcher.extra_env
        assert ex.mps_state == "off: up to 50 ranks a GPU at once, more than MPS's 48 clients"
    finally:
        ex.cleanup(keep_work=False)
