"""A rank's DCP stager forked from the run's rank server (harness/worker/stager_fork.py): it
takes its rank's environment, nice value and log, dies with its rank, and where the server
cannot fork it the caller is told that no process started (then DCP spawns it). That a forked
launch's async_process saves give the fresh launch's values bit for bit, with its stagers
forked, is tests/test_rank_server.py's."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.launch import procs
from harness.launch.launch import run_env
from harness.launch.rank_server import RankServer
from harness.worker import stager_fork

ROOT = Path(__file__).resolve().parent.parent

RANK = """\
import os, sys, time
from harness.worker import stager_fork
os.environ["MARK"] = "the rank's environment"
os.nice(3)
p = stager_fork.context(sys.argv[1]).Process(target=exec, args=(
    "import os, time; print(os.environ['MARK'], os.nice(0), "
    "repr(os.environ.get('CUDA_VISIBLE_DEVICES')), flush=True); time.sleep(120)",))
p.start()
print(p.pid, flush=True)
time.sleep(120)
"""


def _wait(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


@pytest.mark.integration
@pytest.mark.parametrize("layers, gpus", [("all", "''"), ("all,-stager_no_gpu", "'0'")])
def test_a_forked_stager_is_its_ranks_and_dies_with_it(tmp_path, layers, gpus):
    """... and sees no GPU (layer stager_no_gpu): DCP's writer in it then needs no CUDA
    context of its own."""
    server = RankServer("torch", run_env("cpu", {})).start()
    log = tmp_path / "rank0.log"
    env = {**os.environ, stager_fork.SERVER_VAR: server.address, "RANK": "0",
           "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "0", "HARNESS_ACCELERATIONS": layers}
    rank = subprocess.Popen([sys.executable, "-c", RANK, str(log)], env=env,
                            stdout=subprocess.PIPE, text=True)
    stager = None
    try:
        stager = int(rank.stdout.readline())
        assert _wait(lambda: log.exists() and "environment" in log.read_text(), 60), \
            log.read_text() if log.exists() else "no log"
        # env, nice, log; no GPU where the layer is on
        assert log.read_text().split("\n")[0] == f"the rank's environment 3 {gpus}"
        assert Path(f"/proc/{stager}/comm").read_text().strip().startswith("harness-stager")
        assert os.getppid() != stager and procs.alive(stager)
        rank.kill()  # SIGKILL: no clean-up code runs in the rank
        rank.wait(timeout=10)
        assert _wait(lambda: not procs.alive(stager), 5.0), "the stager outlived its rank"
        assert procs.alive(server.pid)  # the server serves the run's other launches
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait(timeout=10)
        if stager is not None and procs.alive(stager):
            os.kill(stager, signal.SIGKILL)
        server.stop()


def test_no_server_no_process(tmp_path):
    """A socket nobody listens on: nothing starts, and the caller is told so (it spawns the
    stager as DCP does, distributed/stager.py)."""
    ctx = stager_fork.ServerContext(str(tmp_path / "no-server"), str(tmp_path / "log"))
    p = ctx.Process(target=print)
    with pytest.raises(OSError) as e:
        p.start()
    assert e.value.no_process and "no-server" in str(e.value)
    assert p.pid is None


def test_no_server_var_no_context(monkeypatch):
    monkeypatch.delenv(stager_fork.SERVER_VAR, raising=False)
    assert stager_fork.context("log") is None
    monkeypatch.setenv(stager_fork.SERVER_VAR, "/x/socket")
    assert stager_fork.context("log").address == "/x/socket"


def test_prestart_spawns_the_stager_where_the_server_forks_none(monkeypatch, tmp_path):
    """DCP's constructor gets the server's context; where it starts nothing, DCP's own spawn
    context (and ``ape.mp`` is DCP's again either way)."""
    import torch.multiprocessing
    from torch.distributed.checkpoint import _async_process_executor as ape

    from harness.distributed import stager
    asked = []

    class FakeStager:  # what DCP's _AsyncCheckpointProcess.__init__ does first
        def __init__(self, pg_init_info):
            ctx = ape.mp.get_context("spawn")
            asked.append(type(ctx).__name__)
            if isinstance(ctx, stager_fork.ServerContext):
                ctx.Process(target=print).start()
    monkeypatch.setattr(ape, "_AsyncCheckpointProcess", FakeStager)
    monkeypatch.setattr(ape, "_ProcessGroupInitInfo", lambda group: "info")
    monkeypatch.setattr(ape, "_CHECKPOINT_PROCESS", None)
    monkeypatch.setattr(stager, "HOW", [])
    monkeypatch.setattr(stager, "_thread", None)
    monkeypatch.setattr(stager, "_context", stager_fork.ServerContext(
        str(tmp_path / "none"), str(tmp_path / "log")))
    assert stager.prestart(None)
    stager.wait(10)
    assert asked == ["ServerContext", "SpawnContext"]
    assert isinstance(ape._CHECKPOINT_PROCESS, FakeStager) and ape.mp is torch.multiprocessing
    (how,) = stager.HOW
    assert how.startswith("spawned (the rank server's socket ") and "none" in how, how


def test_the_first_save_starts_the_stager_from_the_context_unless_one_started(monkeypatch):
    """Where no stager started with the launch, the first async_process save starts it from
    the rank server's context (:func:`stager.start`); without a context DCP starts it itself,
    and a started one is never started again."""
    from harness.distributed import stager
    calls = []
    monkeypatch.setattr(stager, "prestart", lambda group: calls.append(group))
    monkeypatch.setattr(stager, "_thread", None)
    monkeypatch.setattr(stager, "_context", None)
    stager.start("group")
    assert calls == []  # no rank server: DCP spawns it as usual
    stager.use("the server's context")
    stager.start("group")
    assert calls == ["group"]
    monkeypatch.setattr(stager, "_thread", "started")
    stager.start("group")
    assert calls == ["group"]
