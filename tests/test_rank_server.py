"""The run's rank server (harness/launch/rank_server.py, the default on one-node GPU runs):
agents and ranks forked from one process that imported their modules, against torchrun's fresh
Python per rank -- the same results to the bit, no imports at a rank's start, a failed preload
falling back to fresh ranks, a forked rank's death still named with its signal, and the
server gone with its run."""

import dataclasses
import json
import os
import signal
import sys
import threading
import time
import types

import pytest

from harness.launch import fork_agent, launch_dir, procs
from harness.launch.launch import run_env
from harness.launch.launcher import Launcher, Task
from harness.launch.rank_server import RankServer
from harness.plugin import execution
from harness.results.run_record import RunRecord
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario
from harness.worker import stager_fork

SCENARIO = """\
name: forked
description: one small case, trained, saved, loaded and checked
axes:
  recipe: [fp32]
  mesh: [dp2]
  module: [LayerNormMLP]
  dcp: [async_process]
  reshard: [none]
timeout_s: 120
"""


def _run(tmp_path, name: str, server=None):
    (tmp_path / "forked.yaml").write_text(SCENARIO)
    (case,) = expand(load_scenario(tmp_path / "forked.yaml"), "torch")
    launcher = Launcher(tmp_path / name, "torch", "cpu", rank_server=server)
    task = Task(f"{case.key}.train", case, "train", tmp_path / f"ckpt-{name}")
    (result,) = launcher.run_batch([task], 2).values()
    (launch,) = launcher.records
    d = tmp_path / name / launch.name
    timelines = [json.loads(p.read_text()) for p in (d / "progress").glob("timeline*")]
    return result, timelines, (d / "torchrun.log").read_text(), launch


def _values(result) -> dict:
    return {(r["check"], r.get("quantity"), r.get("metric")): r.get("value")
            for r in result.rows if r.get("quantity") != "time" and r.get("metric") != "seconds"}


@pytest.mark.integration
def test_forked_ranks_give_the_fresh_ranks_results_bit_for_bit(tmp_path):
    server = RankServer("torch", run_env("cpu", {})).start()
    try:
        server_pid = server.pid
        forked, forked_lines, log, record = _run(tmp_path, "fork", server)
        assert procs.alive(server_pid)  # one server for every launch of the run
    finally:
        server.stop()
    assert not procs.alive(server_pid) and not os.path.exists(server.dir)
    fresh, fresh_lines, _, _ = _run(tmp_path, "fresh")
    assert record.fresh_ranks == ""  # the launch's ranks forked
    assert forked.status == fresh.status == "ok", (forked.errors, fresh.errors, log)
    values = _values(forked)
    assert len(values) > 20 and values == _values(fresh)  # losses, norms, round trips
    # a forked rank's imports are the server's: none at its start; a fresh rank imports torch
    assert all(t["imports"] - t["main"] < 0.2 for t in forked_lines), forked_lines
    assert all(t["imports"] - t["main"] > 0.2 for t in fresh_lines), fresh_lines
    assert len(forked_lines) == len(fresh_lines) == 2
    # the ranks' DCP stagers fork from the server too (a fresh rank's spawn as DCP's do)
    assert [t["stager"] for t in forked_lines] == ["forked"] * 2, forked_lines
    assert [t["stager"] for t in fresh_lines] == ["spawned"] * 2, fresh_lines


@pytest.mark.integration
def test_a_stager_not_started_with_the_launch_forks_at_the_first_save(tmp_path, monkeypatch):
    """CPU runs start no stager with the launch (its plan says none: ``stager_prestart`` is
    GPU only): the first async_process save starts it from the server too, instead of DCP
    spawning a fresh Python that imports torch (tens of seconds on a busy 2-core host)."""
    from harness.launch import launch_dir
    monkeypatch.setattr(launch_dir, "stager_worlds", lambda cases: set())
    server = RankServer("torch", run_env("cpu", {})).start()
    try:
        result, lines, log, _ = _run(tmp_path, "lazy", server)
    finally:
        server.stop()
    plan = json.loads(next((tmp_path / "lazy").glob("*/plan.json")).read_text())
    assert plan["stager"] is False and result.status == "ok", (result.errors, log)
    assert [t["stager"] for t in lines] == ["forked"] * 2, lines


@pytest.mark.integration
def test_a_server_whose_imports_failed_starts_fresh_ranks(tmp_path):
    """The preload is never fatal: every agent says why and runs torchrun's fresh ranks."""
    server = RankServer("no_such_backend", run_env("cpu", {})).start()
    try:
        result, lines, log, record = _run(tmp_path, "fallback", server)
    finally:
        server.stop()
    assert result.status == "ok", (result.errors, log)
    assert "the rank server's imports failed (ValueError: unknown backend 'no_such_backend'" \
        in log and "ranks start as fresh Pythons" in log
    assert all(t["imports"] - t["main"] > 0.2 for t in lines), lines  # they imported torch
    # the launch's record says so, and so does the run's meta (not plainly "fork")
    assert record.fresh_ranks.startswith("the rank server's imports failed (ValueError: unknown "
                                         "backend 'no_such_backend'"), record.fresh_ranks
    hs = types.SimpleNamespace(config=types.SimpleNamespace(getoption={
        "rank_start": "fork", "nnodes": 1, "node_launcher": None}.get), device="cpu")
    # the launch records as a run hands them on to its meta (the plugin's callback)
    run = RunRecord(time.time(), tmp_path / "reports", False, None)
    run.on_launch(record)
    run.on_launch(dataclasses.replace(record, fresh_ranks=""))
    launches = run.pop_launch_records()
    assert execution.rank_start_recorded(hs, launches) == \
        f"fork (1 of 2 launches fresh: {record.fresh_ranks})"
    assert execution.rank_start_recorded(hs, launches[1:]) == "fork"


def test_a_forked_ranks_death_is_named_with_its_signal():
    """torchrun's summary of forked ranks names only the first failure; the agent's own line
    per failed process names the others (the pid mapped to its rank)."""
    log = (fork_agent.EXIT_LINE.format(pid=4242, code=-9) + "\n" +
           fork_agent.EXIT_LINE.format(pid=4243, code=1) + "\n" +
           fork_agent.EXIT_LINE.format(pid=999, code=1) + "\n")  # not a rank of this launch
    assert launch_dir.rank_exits(log, {4242: 1, 4243: 0}) == {
        1: "killed by SIGKILL", 0: "exit code 1"}
    summary = "[1]:\n  time      : x\n  host      : h\n  rank      : 3 (local_rank: 3)\n" \
              "  exitcode  : -6 (pid: 77)\n"
    assert launch_dir.rank_exits(summary) == {3: "killed by SIGABRT"}


@pytest.mark.parametrize("device, gpus, given, nnodes, xdist, want", [
    ("cuda", ["0"], "auto", 1, None, True), ("cpu", [], "auto", 1, None, True),
    ("cuda", [], "auto", 1, None, False), ("cpu", [], "fork", 1, None, True),
    ("cuda", ["0"], "fresh", 1, None, False), ("cuda", ["0"], "auto", 2, None, False),
    ("cuda", ["0"], "auto", 1, 2, False)])
def test_where_ranks_fork(monkeypatch, device, gpus, given, nnodes, xdist, want):
    """auto forks on CPU and on cuda with a GPU visible (a CPU-only CI's TE run skips every
    case: no server) and one node; never over nodes nor in an xdist controller (its workers run the
    launches)."""
    monkeypatch.setattr(RankServer, "start", lambda self: self)
    opts = {"rank_start": given, "nnodes": nnodes, "node_launcher": None,
            "collectonly": False}
    config = types.SimpleNamespace(getoption=opts.get,
                                   option=types.SimpleNamespace(numprocesses=xdist))
    hs = types.SimpleNamespace(config=config, device=device, backend="te", worker_id=None,
                               env=types.SimpleNamespace(visible_gpus=lambda: gpus))
    server = execution.rank_server_for(hs)
    assert (server is not None) == want
    # what the run's meta.json says (an xdist controller's workers fork)
    assert execution.rank_start(hs) == ("fork" if want or xdist else "fresh")
    if want:
        assert server.backend == "te" and server.env["OMP_NUM_THREADS"] == "1"
        launcher = Launcher("/nonexistent", "te", device, rank_server=server, nnodes=1)
        assert launcher.rank_server is server
        with pytest.raises(ValueError, match="one-node launches only"):  # the plugin decides
            Launcher("/x", "te", device, rank_server=server, nnodes=2)


def test_agents_answer_cuda_questions_from_nvml(monkeypatch, tmp_path):
    """An agent with the launch's environment asked the CUDA runtime for the device count
    (torch then poisons every later fork -- each forked rank failed with
    "Cannot re-initialize CUDA in forked subprocess"); the server and every agent get NVML's
    check."""
    started = []

    class Process:
        def __init__(self, target, args, name):
            self.pid, self.exitcode = None, None
            started.append((target, args))

        def start(self):
            self.pid = 1

    server = RankServer("te", {"A": "1"})
    server.pid = os.getpid()  # a live "server" (nothing is forked: Process is a stand-in)
    server.address = str(tmp_path / "socket")
    monkeypatch.setattr(server.ctx, "Process", Process)
    argv = ["python", "-m", "harness.launch.tethered", "torch.distributed.run", "--standalone"]
    agent = server.start_agent(argv, {"B": "2"}, tmp_path / "log", tmp_path, 5.0)
    (target, (args, env, log, cwd)), = started
    assert target is fork_agent.agent_main and args == ["--standalone"]
    assert env == {"B": "2", "PYTORCH_NVML_BASED_CUDA_CHECK": "1",  # and where stagers fork
                   stager_fork.SERVER_VAR: server.address}
    assert agent.poll() is None and agent.pid == 1


@pytest.mark.integration
def test_a_server_that_died_leaves_fresh_agents(tmp_path):
    server = RankServer("torch", run_env("cpu", {})).start()
    try:
        os.kill(server.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while procs.alive(server.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        result, lines, log, record = _run(tmp_path, "dead", server)
    finally:
        server.stop()
    assert result.status == "ok", (result.errors, log)
    assert server.broken == "the rank server exited" and \
        "the rank server exited; this launch's ranks start as fresh Pythons" in log
    assert all(t["imports"] - t["main"] > 0.2 for t in lines), lines  # they imported torch
    assert record.fresh_ranks == "the rank server exited"


def test_a_server_that_forks_nothing_is_bounded(monkeypatch, tmp_path):
    """Starting a forked agent waits for the server's imports; where they never end the wait
    ends at the launch's start-up bound, the server is killed and the agent starts fresh."""
    server = RankServer("torch", run_env("cpu", {})).start()
    release = threading.Event()

    class Stuck:
        pid = None

        def __init__(self, **kw):
            pass

        def start(self):
            release.wait(30)

    monkeypatch.setattr(server.ctx, "Process", Stuck)
    argv = [sys.executable, "-c", "print('a fresh agent')", "torch.distributed.run"]
    try:
        t0 = time.monotonic()
        agent = server.start_agent(argv, dict(os.environ), tmp_path / "log", tmp_path, 0.5)
        assert agent.wait(timeout=30) == 0 and time.monotonic() - t0 < 10
        deadline = time.monotonic() + 10  # SIGKILLed: gone a moment later
        while procs.alive(server.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not procs.alive(server.pid)
    finally:
        release.set()
        server.stop()
    text = (tmp_path / "log").read_text()
    assert "the rank server forked no agent within 0.5 s" in text and "a fresh agent" in text


@pytest.mark.integration
def test_a_closed_server_ends_by_itself_and_forks_nothing_more(tmp_path):
    """close() (the run's last launch ended) lets the server exit while the run writes its
    results; stop() then only reaps it; a launch after close() would start fresh."""
    server = RankServer("torch", run_env("cpu", {})).start()
    try:
        pid = server.pid
        server.close()
        deadline = time.monotonic() + 30  # it may still be importing: it exits after that
        while procs.alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not procs.alive(pid)  # ended by itself, before anyone waited for it
        assert server.broken == "the rank server was closed"
        argv = [sys.executable, "-c", "print('a fresh agent')", "torch.distributed.run"]
        agent = server.start_agent(argv, dict(os.environ), tmp_path / "log", tmp_path, 5.0)
        assert agent.wait(timeout=30) == 0
        assert "the rank server was closed; this launch's ranks start as fresh" in \
            (tmp_path / "log").read_text()
    finally:
        t0 = time.monotonic()
        server.stop()
    assert time.monotonic() - t0 < 2  # nothing left to wait for
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped
    assert not os.path.exists(server.dir)


@pytest.mark.integration
def test_a_server_no_launch_used_stops_without_waiting_for_its_imports():
    """A run that selects no case (``-k`` a typo) or skips every one never asks its server for
    an agent: stop() kills it at once instead of waiting until it has imported torch and the
    backend (seconds on a 2-core machine)."""
    server = RankServer("torch", run_env("cpu", {})).start()
    pid, t0 = server.pid, time.monotonic()
    server.stop()
    assert time.monotonic() - t0 < 1.0  # torch's import alone takes longer
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped
    assert not procs.alive(pid) and not os.path.exists(server.dir)


def test_the_run_closes_its_server_once_its_lanes_ended():
    """Execution.shutdown: the lanes end first (every launch and agent done), then the server
    is closed -- its exit overlaps the writing of the run's results (the tasks' seconds for the
    next run first)."""
    order = []
    ex = execution.Execution.__new__(execution.Execution)
    ex.scheduler = types.SimpleNamespace(
        shutdown=lambda: order.append("lanes"),
        graph=types.SimpleNamespace(measured_s=lambda: order.append("seconds") or {}))
    ex.launcher = types.SimpleNamespace(
        rank_server=types.SimpleNamespace(close=lambda: order.append("server")))
    ex.shutdown()
    assert order == ["lanes", "server", "seconds"]
    ex.launcher.rank_server = None  # fresh ranks: nothing to close
    ex.shutdown()
    assert order == ["lanes", "server", "seconds", "lanes", "seconds"]
