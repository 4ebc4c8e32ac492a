"""Ctrl-C / SIGTERM mid-launch: a real ``pytest --scenario`` subprocess is signalled while a
launch is in the middle of its batch (one case finished, the next one running, a process-staged
async DCP helper alive): a terminal's Ctrl-C (SIGINT to the process group, the ranks forked as
by default) and SIGTERM to pytest alone (fresh and forked ranks). It must stop within seconds
with pytest's exit status 2, leave no process and no work directory behind, and write a valid
history holding the finished case and the unfinished ones as ``interrupted``. And when pytest
is SIGKILLed (no clean-up code can run; what a crashed pytest-xdist worker looks like), the
tethers still take every process down, and the next run removes the temporary directories it
left (its work dir, its launch's TMPDIR)."""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
from proc_sampler import Sampler
from subprocs import harness_env, pytest_argv, run_all

from harness.launch import scratch
from harness.report import history

STOP_BOUND_S = 20.0

# fault "hang" keeps the second case running (rank 1 sleeps) until the signal comes
SCENARIO = """\
name: stopme
description: Ctrl-C self-test
axes:
  recipe: [fp32]
  mesh: [dp2]
  module: [Linear]
  dcp: [async_process]
  reshard: [none]
  fault: [none, hang, perturb_loaded]
timeout_s: 120
"""
FINISHED = "stopme[fp32-dp2-Linear-async_process-none-none]"
UNFINISHED = ("stopme[fp32-dp2-Linear-async_process-none-hang]",
              "stopme[fp32-dp2-Linear-async_process-none-perturb_loaded]")


def _mid_batch(reports: Path, timeout_s: float = 180.0) -> Path:
    """Wait (bounded) until a launch finished its first task and runs the next; its dir."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for launch in reports.glob("runs/*/launches/L*"):
            done = list((launch / "results").glob("*.json"))
            running = []
            for f in (launch / "progress").glob("rank*.json"):
                try:
                    running.append(json.loads(f.read_text()).get("task"))
                except (OSError, ValueError):
                    continue
            if done and any(t and t.endswith("hang.train") for t in running):
                return launch
        time.sleep(0.2)
    raise AssertionError(f"no launch got mid-batch within {timeout_s:.0f}s")


@pytest.fixture
def scratch_tmp():
    """The run's TMPDIR (its launches' temporary directories): a directory of the test's own,
    removed after it -- not /tmp, where a killed run's would stay. Short: Unix sockets are
    made in it."""
    d = Path(tempfile.mkdtemp(prefix="int-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _env(scratch_tmp: Path) -> dict:
    return {**harness_env(), "TMPDIR": str(scratch_tmp)}


def _start(tmp_path, scratch_tmp, rank_start="fresh"):
    """A ``pytest --scenario stopme`` subprocess in a session of its own, its ranks started
    ``rank_start`` (fresh Pythons, or forked from the run's rank server); (popen, reports,
    work dir)."""
    scen = tmp_path / "scen"
    scen.mkdir()
    (scen / "stopme.yaml").write_text(SCENARIO)
    reports, work = tmp_path / "reports", tmp_path / "work"
    work.mkdir()
    env = _env(scratch_tmp)
    argv = pytest_argv("--scenario", "stopme", "--scenario-dir", str(scen), "--report-dir",
                       str(reports), "--work-dir", str(work), "--rank-start", rank_start)
    # as a terminal's pytest: a shell's background job (how this suite may itself be run)
    # ignores SIGINT, a child inherits that and Python then never raises KeyboardInterrupt --
    # the SIGINT case timed out twice that way; a handler here is reset to the default on exec
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        p = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, old)
    return p, reports, work


def _wait_gone(sampler, timeout_s: float) -> float:
    """Seconds until every sampled process is gone (bounded by ``timeout_s``)."""
    t0 = time.monotonic()
    while sampler.survivors() and time.monotonic() - t0 < timeout_s:
        time.sleep(0.05)
    return time.monotonic() - t0


def _stagers_seen(sampler, rank_start: str) -> bool:
    """DCP's stagers ran: spawned by fresh ranks, forked by the rank server (named)."""
    if rank_start == "fresh":
        return any("multiprocessing.spawn" in c for c in sampler.seen.values())
    return any(n.startswith("harness-stager") for n in sampler.names.values())


@pytest.mark.integration
@pytest.mark.parametrize("who, sig, rank_start", [
    ("group", signal.SIGINT, "fork"), ("pytest", signal.SIGTERM, "fresh"),
    ("pytest", signal.SIGTERM, "fork")],
    ids=["SIGINT-to-group", "SIGTERM-to-pytest", "SIGTERM-to-pytest-forked-ranks"])
def test_signal_stops_the_run_cleanly(tmp_path, scratch_tmp, who, sig, rank_start):
    p, reports, work = _start(tmp_path, scratch_tmp, rank_start)
    try:
        with Sampler(reports, roots=[p.pid]) as sampler:
            _mid_batch(reports)
            time.sleep(0.5)  # let the sampler see the running ranks
            t0 = time.monotonic()
            (os.killpg if who == "group" else os.kill)(p.pid, sig)
            try:
                out, _ = p.communicate(timeout=90)
            except subprocess.TimeoutExpired:  # where it hangs: pytest's threads' stacks
                os.kill(p.pid, signal.SIGUSR1)
                time.sleep(2)
                stacks = "".join(f.read_text()
                                 for f in reports.glob("runs/*/launches/pytest-stacks.txt"))
                pytest.fail(f"pytest did not stop within 90 s of {signal.Signals(sig).name}; "
                            f"its threads:\n{stacks[-8000:]}")
            stop_s = time.monotonic() - t0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
    print(f"{signal.Signals(sig).name} to {who}: pytest exited {p.returncode} after "
          f"{stop_s:.1f}s; {len(sampler.seen)} processes of the run seen")
    assert p.returncode == 2, out
    assert stop_s < STOP_BOUND_S, out
    # ranks were seen running (a forked rank has its agent's or the agent server's command
    # line; the pids the ranks wrote name them)
    assert sampler.ranks & set(sampler.seen), sampler.seen
    assert _stagers_seen(sampler, rank_start)
    assert sampler.survivors() == {}, "processes outlived pytest"
    assert list(work.iterdir()) == [], "the checkpoint work directory was left behind"
    assert list(scratch_tmp.iterdir()) == [], "a launch's temporary directory was left behind"

    (parquet,) = (reports / "history").glob("*.parquet")
    df, meta = history.read_run(parquet)  # a valid, complete history file
    cases = df[df["check"] == "case"].set_index("case_id")
    assert cases.loc[FINISHED, "case_outcome"] == "passed"
    for cid in UNFINISHED:
        assert cases.loc[cid, "case_outcome"] == "interrupted"
        assert cases.loc[cid, "case_status"] == "interrupted"
    summary = pd.read_csv(reports / "runs" / meta["run_id"] / "summary.csv")
    assert sorted(summary["case_outcome"]) == ["interrupted", "interrupted", "passed"]
    assert any(r.get("interrupted") for r in meta["launches"])
    assert "2 interrupted" in out


@pytest.mark.integration
@pytest.mark.parametrize("rank_start", ["fresh", "fork"])
def test_sigkilled_pytest_takes_its_launch_down(tmp_path, scratch_tmp, rank_start):
    p, reports, work = _start(tmp_path, scratch_tmp, rank_start)
    try:
        with Sampler(reports, roots=[p.pid]) as sampler:
            launch = _mid_batch(reports)
            time.sleep(0.5)
            # a live run's own account of where it is: kill -USR1 -> its threads' stacks
            # (again each second: a dump catches the main thread wherever it is at that
            # instant, which may be between two of the scheduler's calls)
            stacks_file = launch.parent / "pytest-stacks.txt"
            deadline, sent = time.monotonic() + 10, 0.0
            while time.monotonic() < deadline and "scheduler.py" not in (
                    stacks_file.read_text() if stacks_file.exists() else ""):
                if time.monotonic() - sent >= 1.0:
                    os.kill(p.pid, signal.SIGUSR1)
                    sent = time.monotonic()
                time.sleep(0.1)
            stacks = stacks_file.read_text()
            assert "scheduler.py" in stacks and "launch.py" in stacks  # main thread, a lane
            assert p.poll() is None  # the dump did not stop the run
            os.kill(p.pid, signal.SIGKILL)  # pytest only: its launch is in other sessions
            p.communicate(timeout=30)
            gone_s = _wait_gone(sampler, 20.0)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
    leftovers = sampler.survivors()
    for pid in leftovers:  # never leave them running, even when the test fails
        os.kill(pid, signal.SIGKILL)
    print(f"pytest SIGKILLed: its {len(sampler.seen)} processes gone after {gone_s:.1f}s")
    assert _stagers_seen(sampler, rank_start)
    assert leftovers == {}

    # what no clean-up code could remove: the work dir and the launch's TMPDIR (and the rank
    # server's socket dir), marked with the killed pytest's pid; the next run removes them
    left = sorted(work.iterdir()) + sorted(scratch_tmp.iterdir())
    n = 3 if rank_start == "fork" else 2
    assert len(left) == n and all(scratch.owner(d) == p.pid for d in left), left
    rc, out = run_all([pytest_argv("--scenario", "stopme", "--scenario-dir",
                                   str(tmp_path / "scen"), "--report-dir", str(reports),
                                   "--work-dir", str(work), "-k", "no_such_case")],
                      timeout=120, cwd=tmp_path, env=_env(scratch_tmp))[0]
    assert rc == 4, out  # nothing selected: the sweep came first
    where = ", ".join(sorted({str(scratch_tmp.resolve()), str(work.resolve())}))
    assert f"harness: removed {n} temporary directories left in {where} by runs that were " \
           f"killed (pids {p.pid}; " in out, out
    assert not any(d.exists() for d in left), left
