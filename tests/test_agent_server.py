"""The agent server (harness/agent_server.py): it forks torchrun agents that behave like the
``subprocess.Popen`` ones they replace (exit status, log, session, tether), ends everything it
forked when closed, exits when idle, and serves only launches of its own environment.
The launches of tests/test_no_leaks.py (hang, crash, raise) go through it with forked ranks."""

import os
import sys
import time

import pytest

from harness import agent_server, procs
from harness.launch import SAFE_ENV
from subprocs import harness_env


def _argv(plan) -> list[str]:
    """What the launcher runs for a 1-rank launch (harness/launcher.py ``torchrun_argvs``)."""
    return [sys.executable, "-m", "harness.tethered", "--parent", str(os.getpid()),
            "harness.fork_agent", "--standalone", "--nproc-per-node=1", "--max-restarts=0",
            "--monitor-interval=0.1", "-m", "harness.worker", "--plan", str(plan)]


def _env(tmp_path, tag) -> dict:
    return {**harness_env(), **SAFE_ENV, procs.TAG_VAR: tag, "TMPDIR": str(tmp_path)}


def _until(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


def test_launch_argv_and_environment_keys():
    plan = "/x/plan.json"
    assert agent_server.agent_args(_argv(plan), sys.executable)[-2:] == ["--plan", plan]
    fresh = _argv(plan)
    fresh[5] = "torch.distributed.run"  # --rank-start fresh: torchrun itself, not ours
    assert agent_server.agent_args(fresh, sys.executable) is None
    other_parent = _argv(plan)
    other_parent[4] = "1"
    assert agent_server.agent_args(other_parent, sys.executable) is None
    base = {"PATH": "/bin", "PYTHONPATH": "/a"}
    per_launch = {procs.TAG_VAR: "t2", "TMPDIR": "/t2", "CUDA_VISIBLE_DEVICES": "1"}
    assert agent_server.env_key({**base, procs.TAG_VAR: "t1", "TMPDIR": "/t1"}) == \
        agent_server.env_key({**base, **per_launch})
    assert agent_server.env_key(base) != agent_server.env_key({**base, "PYTHONPATH": "/b"})
    assert agent_server.env_key(base) != agent_server.env_key({**base, "OMP_NUM_THREADS": "4"})


@pytest.mark.integration
def test_exit_status_and_log_come_back_and_an_idle_server_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setattr(agent_server, "IDLE_S", 1.0)
    servers = agent_server.Servers(sys.executable, str(tmp_path))
    tag = procs.new_tag("agent-test")
    try:
        first_pid = None
        for attempt in range(2):
            d = tmp_path / f"launch{attempt}"
            d.mkdir()
            with open(d / "torchrun.log", "w") as out:
                agent = servers.start_agent(_argv(d / "missing.json"), _env(tmp_path, tag),
                                            str(d), out)
            assert isinstance(agent, agent_server.AgentProc)
            assert agent.wait(timeout=120) == 1  # the rank could not read its plan
            log = (d / "torchrun.log").read_text()
            assert "missing.json" in log and "FileNotFoundError" in log, log
            (server,) = servers.by_key.values()
            if first_pid is None:
                first_pid = server.proc.pid
                # no agent left: the server exits by itself
                assert _until(lambda: not server.alive(), 30), "the idle server did not exit"
            else:
                assert server.proc.pid != first_pid  # a new server for the next launch
    finally:
        servers.close()
    assert procs.tagged(tag) == []


@pytest.mark.integration
def test_a_forked_agent_is_a_tethered_session_and_ends_when_dropped(tmp_path):
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)  # the rank blocks opening its plan: a launch that never ends by itself
    servers = agent_server.Servers(sys.executable, str(tmp_path))
    tag = procs.new_tag("agent-test")
    try:
        with open(tmp_path / "torchrun.log", "w") as out:
            agent = servers.start_agent(_argv(fifo), _env(tmp_path, tag), str(tmp_path), out)
        (server,) = servers.by_key.values()
        assert _until(lambda: procs.descendants([agent.pid]), 60), "no rank was forked"
        rank = min(procs.descendants([agent.pid]))
        info = procs.info(agent.pid)
        assert info.ppid == server.proc.pid and info.pgid == agent.pid  # a session of its own
        assert procs.info(rank).pgid == agent.pid
        # what /proc shows of a forked process's environment is the server's: its tag
        assert {agent.pid, rank} <= set(procs.tagged(server.tag))
        assert agent.poll() is None
        assert procs.cmdline(agent.pid) == " ".join(server.argv)
        # a launcher that drops the agent's connection ends it; the server lives on
        agent.conn.close()
        assert _until(lambda: not procs.alive(agent.pid) and not procs.alive(rank), 10)
        assert server.alive()
    finally:
        servers.close()
    assert not procs.alive(server.proc.pid)
    assert not os.path.exists(server.tmp)


@pytest.mark.integration
def test_close_ends_the_server_and_every_process_it_forked(tmp_path):
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    servers = agent_server.Servers(sys.executable, str(tmp_path))
    try:
        with open(tmp_path / "torchrun.log", "w") as out:
            agent = servers.start_agent(_argv(fifo), _env(tmp_path, procs.new_tag("agent-test")),
                                        str(tmp_path), out)
        (server,) = servers.by_key.values()
        assert _until(lambda: procs.descendants([agent.pid]), 60), "no rank was forked"
        rank = min(procs.descendants([agent.pid]))
    finally:
        servers.close()
    assert agent.wait(timeout=10) < 0  # killed
    for pid in (server.proc.pid, agent.pid, rank):
        # bounded: in one clean-clone CI run on the loaded 2-core VM a process was still alive
        # right after close() (which of the three not recorded; the message now says)
        assert _until(lambda: not procs.alive(pid), 10), \
            f"{pid} survived close(): {procs.info(pid)} {procs.cmdline(pid)!r}"
    assert not os.path.exists(server.tmp)
