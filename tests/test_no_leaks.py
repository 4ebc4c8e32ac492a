"""No process of a launch outlives it: hang (timeout kill), crash and raise, with an async DCP
stager process alive at the kill; and the tether (PR_SET_PDEATHSIG) that takes a launch down
when its parent dies.

Pids are collected independently of the launcher's own bookkeeping: a sampler thread records
every descendant of this test process (torchrun, its ranks, their stagers) and every pid the
ranks write into their progress files, while the launches run; after the scheduler returns,
none may be alive (a zombie is dead). Nor may any file they made in the temporary directory
(torchrun's log dir, multiprocessing's ``pymp-*``) outlive them.
"""

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
from collections import Counter
from pathlib import Path

import pytest
from forked import rank_server
from proc_sampler import Sampler

from harness.launch import ending, launch, procs
from harness.launch.launcher import Launcher
from harness.launch.rank_server import RankServer
from harness.launch.scheduler import Scheduler
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent

SCENARIO = """\
name: leaks
description: every way a launch ends, with a process-staged async DCP save before the hang
axes:
  recipe: [fp32]
  mesh: [dp2]
  module: [Linear]
  dcp: [async_process, sync]
  reshard: [none]
  fault: [none, hang, crash, raise]
cases:
  - {dcp: async_process, fault: [none, hang]}
  - {dcp: sync, fault: [crash, raise]}
timeout_s: 15
"""


def _kind(pid: int, cmdline: str, sampler: Sampler) -> str:
    """A rank names itself; one that ended between two samples is known from the pid it
    wrote."""
    words, name = cmdline.split(), sampler.names.get(pid, "")
    if pid in sampler.ranks or name.startswith("harness-rank"):
        return "rank"
    if "torch.distributed.run" in words or name == "pt_elastic":
        return "torchrun"
    if "harness.worker" in words:
        return "rank"
    if name.startswith("harness-stager"):  # forked from the rank server
        return "spawned"
    return "spawned" if "multiprocessing.spawn" in words else "other"


@pytest.mark.integration
@pytest.mark.parametrize("rank_start", ["fresh", "fork"])
def test_no_process_survives_hang_crash_raise(tmp_path, monkeypatch, request, rank_start):
    # this process's and the launches' temporary directory (short: Unix sockets are made in it)
    systmp = Path(tempfile.mkdtemp(prefix="leaks-"))
    request.addfinalizer(lambda: shutil.rmtree(systmp, ignore_errors=True))
    monkeypatch.setenv("TMPDIR", str(systmp))
    monkeypatch.setattr(tempfile, "tempdir", str(systmp))
    (tmp_path / "leaks.yaml").write_text(SCENARIO)
    # only the hang needs the short case timeout (the scenario's 15 s: how long it takes to be
    # killed); the clean case's process-staged save starts a stager that imports torch, which
    # passed 15 s on the loaded 2-core CI VM (fresh ranks) -- its timeout is not what is tested
    cases = [dataclasses.replace(c, timeout_s=60.0) if c.ax["fault"] == "none" else c
             for c in expand(load_scenario(tmp_path / "leaks.yaml"), "torch")]
    server = RankServer("torch", launch.run_env("cpu", {})).start() \
        if rank_start == "fork" else None
    request.addfinalizer(lambda: server and server.stop())
    launcher = Launcher(tmp_path / "launches", "torch", "cpu", rank_server=server)
    # three lanes at once (a scope each): the hang's timeout overlaps the other two launches
    scope = lambda c: "async" if c.ax["dcp"] == "async_process" else c.ax["fault"]  # noqa: E731
    with Sampler(tmp_path / "launches") as sampler, \
            Scheduler(launcher, cases, tmp_path / "ckpt", scope) as sched:  # exit: lanes end
        results = {c.ax["fault"]: sched.result(c) for c in cases}
    assert results["none"].passed, results["none"].errors
    assert results["hang"].status == "timeout"
    assert results["crash"].status == "crash"
    raised = [r for r in results["raise"].failed_rows if r["check"] == "train"]
    assert raised and "injected fault" in raised[0]["detail"]  # recorded, the launch went on
    kinds = Counter(_kind(p, c, sampler) for p, c in sampler.seen.items())
    kinds["rank"] += len(sampler.ranks - set(sampler.seen))
    assert kinds["torchrun"] == 3 and kinds["rank"] == 6, sampler.seen
    assert kinds["spawned"] >= 2, sampler.seen  # the async_process stagers (+ resource tracker)
    if server is not None:  # the run's server (and the resource tracker it started) outlive
        assert server.pid in sampler.survivors()  # its launches, not its run
        server.stop()
    survivors = sampler.survivors()
    for pid in survivors:  # never leave them running, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert survivors == {}
    assert all(r.leaked == [] for r in launcher.records), [r.leaked for r in launcher.records]
    hang = next(r for r in launcher.records if r.timed_out)
    if rank_start == "fresh":  # (forked ones are in the agent's process group: killed with it)
        assert hang.killed >= 3  # both ranks (one asleep) and rank 0's stager outlived torchrun
    assert sorted(p.name for p in systmp.iterdir()) == []  # no temporary file left behind


def _start_tethered_tree(tmp_path, tag):
    """A parent process that starts ``python -m harness.launch.tethered --parent <it> ...`` running a
    child that sleeps; returns the parent Popen (the child's pid is in tmp_path/child)."""
    child = (f"import os, time; open({str(tmp_path / 'child')!r}, 'w').write(str(os.getpid()));"
             " time.sleep(600)")
    parent = (
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-m', 'harness.launch.tethered', '--parent', "
        f"str(os.getpid()), 'runpy_child'], env={{**os.environ, 'PYTHONPATH': {str(tmp_path)!r}"
        f" + os.pathsep + {str(ROOT)!r}, {procs.TAG_VAR!r}: {tag!r}}})\n"
        "time.sleep(600)\n")
    (tmp_path / "runpy_child.py").write_text(child)
    return subprocess.Popen([sys.executable, "-c", parent], start_new_session=True)


def test_tethered_process_dies_with_its_parent(tmp_path):
    tag = procs.new_tag("tether-test")
    parent = _start_tethered_tree(tmp_path, tag)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "child").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int((tmp_path / "child").read_text())
        assert procs.alive(child) and list(procs.tagged(tag)) == [child]
        os.kill(parent.pid, signal.SIGKILL)  # no clean-up code runs in the parent
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while procs.alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not procs.alive(child), "the tethered child outlived its parent"
    finally:
        procs.kill_tagged(tag, [parent.pid], timeout_s=5)
        parent.wait(timeout=10)


def test_kill_tagged_finds_reparented_processes_and_spares_others(tmp_path):
    tag = procs.new_tag("kill-test")
    # a parent that starts a grandchild in a session of its own and exits: the grandchild is
    # reparented (like a torchrun rank after torchrun was killed)
    code = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(600)'], start_new_session=True, "
            "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, procs.TAG_VAR: tag}, timeout=30)
    orphan = int(out.stdout)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert procs.alive(orphan) and orphan not in procs.descendants([os.getpid()])
        killed, leaked = procs.kill_tagged(tag, timeout_s=10)
        assert killed == [orphan] and leaked == []
        assert not procs.alive(orphan)
        assert procs.alive(bystander.pid)
    finally:
        bystander.kill()
        bystander.wait(timeout=10)


def test_scratch_dir_fits_unix_sockets(monkeypatch, tmp_path):
    """A launch's temporary directory stays where the user's temporary directory is, unless the
    sockets multiprocessing makes there would not fit a Unix socket's path."""
    monkeypatch.setattr(tempfile, "tempdir", "/var/tmp")
    assert launch.scratch_parent() == "/var/tmp"
    deep = tmp_path / ("d" * 60)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    assert launch.scratch_parent() == "/tmp"


def test_an_agent_still_running_is_killed_by_pid(tmp_path):
    """An agent still running at the launch's end is killed by pid, not only as a process
    group: here a child in this test's own process group, which is never signalled as a
    group."""
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    plain = types.SimpleNamespace
    stub = plain(agents=[agent], agent_ids=procs.identities([agent.pid]),
                 settings=plain(gentle_stop=False, device="cpu"), d=tmp_path,
                 plan_path=tmp_path / "plan.json", tag=procs.new_tag("agent-test"), tmp=None)
    try:
        cleanup = ending.end_processes(stub)
        assert agent.poll() == -signal.SIGKILL and cleanup["leaked"] == []
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(timeout=10)


RAISE_SCENARIO = """\
name: unit_raise
description: rank 0's train unit raises before the case's mesh exists
axes:
  recipe: [fp32]
  mesh: [hsdp2x1]
  module: [Linear]
  dcp: [sync]
  reshard: [none]
  fault: [raise]
timeout_s: 40
"""


@pytest.mark.integration
def test_a_unit_raising_on_one_rank_before_the_mesh_exists_is_recorded(tmp_path):
    """Making a mesh is a collective over the world (``new_group``; a 2-D mesh on every
    torch). Made inside the train unit, rank 1 waited there while rank 0, whose unit raised
    first, waited in the units' agreement: the case ran into its timeout. The worker makes the
    phase's mesh before the units: the error is recorded and the launch goes on."""
    (tmp_path / "unit_raise.yaml").write_text(RAISE_SCENARIO)
    cases = expand(load_scenario(tmp_path / "unit_raise.yaml"), "torch")
    with rank_server("torch") as server, \
            Scheduler(Launcher(tmp_path / "launches", "torch", "cpu", rank_server=server),
                      cases, tmp_path / "ckpt") as sched:
        (result,) = [sched.result(c) for c in cases]
    assert result.status == "ok", (result.status, result.errors)
    raised = [r for r in result.failed_rows if r["check"] == "train"]
    assert raised and "injected fault" in raised[0]["detail"]


def test_a_task_makes_its_phase_s_mesh_before_any_unit(monkeypatch, tmp_path):
    """The order the test above needs, on any torch: where new_group connects lazily (torch
    2.13) that test passes either way; torch 2.11 waited there
    (a9e4b78:reports/gpu/h100x1-te2.20.2-mesh-first)."""
    import torch.distributed as dist

    from harness.worker import main, runner
    order = []
    ctx = types.SimpleNamespace(
        rank=1, world_size=2, control=None,
        backend=types.SimpleNamespace(mesh_names=lambda case: {"dp_shard": "shard"}),
        mesh=lambda spec, names: order.append(("mesh", spec, names)))
    monkeypatch.setattr(dist, "barrier", lambda group=None: None)
    monkeypatch.setattr(main, "_agree", lambda ctx, payload, timeout_s: [payload])
    monkeypatch.setattr(runner, "run_phase",
                        lambda ctx, case, phase, *a, **k: order.append(("units", phase)))
    case = next(c for c in expand(load_scenario(ROOT / "scenarios" / "fsdp2_tp_dcp.yaml"))
                if c.target is not None and c.target != c.mesh)
    for phase, spec in (("train", case.mesh), ("reshard", case.target)):
        order.clear()
        main.run_task(ctx, dict(name="t", case=case.to_json(), ckpt_dir=str(tmp_path),
                                phase=phase), dict(health_timeout_s=1.0, control_timeout_s=1.0))
        assert order == [("mesh", spec, {"dp_shard": "shard"}), ("units", phase)], order
