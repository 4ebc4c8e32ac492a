"""A pid names a process only until it is gone: the kernel hands the number on. The launch's
clean-up names each process it found by pid and start time (harness/launch/procs.py), so a
process that took over a pid -- here: a live bystander recorded under another start time, as a
reused pid looks -- is never killed, nor its session, its children or its process group."""

import os
import signal
import subprocess
import sys
import time
import types

from harness.launch import ending, procs

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
# a session leader with a child of its own (its child is in its session, below it)
FAMILY = [sys.executable, "-c",
          "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
          "'import time; time.sleep(600)']); time.sleep(600)"]


def _family():
    """(leader Popen, child's pid -> start)."""
    leader = subprocess.Popen(FAMILY, start_new_session=True)
    deadline = time.monotonic() + 20
    while not procs.descendants([leader.pid]) and time.monotonic() < deadline:
        time.sleep(0.05)
    kids = procs.descendants([leader.pid])
    assert len(kids) == 1, kids
    return leader, kids


def _end(popen, others=None):
    """End what a test started: ``others`` (pid -> start) only while still those processes."""
    if popen.poll() is None:
        popen.kill()
        popen.wait(timeout=10)
    if others:
        procs.kill_tagged(procs.new_tag("none"), others, timeout_s=10)


def test_a_process_is_named_by_pid_and_start_time():
    p = subprocess.Popen(SLEEP)
    try:
        (start,) = procs.identities([p.pid]).values()
        assert procs.same(p.pid, start) and not procs.same(p.pid, start + 1)
        os.kill(p.pid, signal.SIGKILL)  # not reaped: a zombie keeps its pid
        deadline = time.monotonic() + 10
        while not procs.info(p.pid).dead and time.monotonic() < deadline:
            time.sleep(0.02)
        assert procs.identities([p.pid]) == {} and not procs.same(p.pid, start)
    finally:
        _end(p)


def test_kill_tagged_spares_a_pid_that_is_another_process_now():
    p = subprocess.Popen(SLEEP)
    try:
        (start,) = procs.identities([p.pid]).values()
        killed, leaked = procs.kill_tagged(procs.new_tag("none"), {p.pid: start + 1},
                                           timeout_s=2)
        assert p.poll() is None and killed == [] and leaked == []
        killed, leaked = procs.kill_tagged(procs.new_tag("none"), {p.pid: start}, timeout_s=10)
        assert killed == [p.pid] and leaked == []
        assert p.wait(timeout=10) == -signal.SIGKILL
    finally:
        _end(p)


def test_sessions_children_and_groups_of_a_taken_over_pid_are_not_ours():
    leader, child = _family()
    try:
        (start,) = procs.identities([leader.pid]).values()
        assert set(procs.in_sessions({leader.pid: start})) == {leader.pid, *child}
        assert procs.descendants({leader.pid: start}) == child
        assert procs.in_sessions({leader.pid: start + 1}) == {}
        assert procs.descendants({leader.pid: start + 1}) == {}
        procs.kill_group(leader.pid, start + 1)
        time.sleep(0.2)
        assert leader.poll() is None and all(procs.same(*c) for c in child.items())
        procs.kill_group(leader.pid, start)
        assert leader.wait(timeout=10) == -signal.SIGKILL
    finally:
        _end(leader, child)


def test_a_launch_s_end_spares_what_took_over_its_agent_s_pid(tmp_path):
    """The launch recorded its agent under one start time; the pid now leads another session
    (the bystander): the launch's end kills nothing of it."""
    bystander, child = _family()
    try:
        (start,) = procs.identities([bystander.pid]).values()
        stub = types.SimpleNamespace(
            agents=[], agent_ids={bystander.pid: start - 1},
            settings=types.SimpleNamespace(gentle_stop=False, device="cpu"), d=tmp_path,
            plan_path=tmp_path / "plan.json", tag=procs.new_tag("reuse-test"), tmp=None)
        (tmp_path / "progress").mkdir()
        cleanup = ending.end_processes(stub)
        time.sleep(0.2)
        assert bystander.poll() is None and all(procs.same(*c) for c in child.items())
        assert cleanup == dict(killed=0, leaked=[], gpu_held=[])
    finally:
        _end(bystander, child)
