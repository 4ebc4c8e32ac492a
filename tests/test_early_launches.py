"""Early launches (harness/early_launches.py): started before any lane has tasks for them, taken
over by the first lane of their world size, slot and largest case timeout, ended and recorded
when none takes them; end to end, pytest starts them while it collects and ends the ones its
selection (-k) does not need."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import procs
from harness.launcher import Launcher, Task
from harness.matrix import expand
from harness.spec import load_scenario
from subprocs import ROOT, harness_env, pytest_argv, run_pytest

SCENARIO = """\
name: early
description: cases of world 2, one of them resharded onto world 4
axes:
  recipe: [fp32]
  mesh: [dp2]
  module: [Linear]
  dcp: [sync]
  reshard: [none, to_dp4]
timeout_s: 20
"""


def _cases(tmp_path):
    (tmp_path / "early.yaml").write_text(SCENARIO)
    return expand(load_scenario(tmp_path / "early.yaml"), "torch")


def _states(tmp_path, name: str) -> list[str]:
    """What each rank of launch ``name`` last said it was doing."""
    out = []
    for f in sorted((tmp_path / "launches" / name / "progress").glob("rank*.json")):
        try:
            out.append(json.loads(f.read_text())["state"])
        except (OSError, ValueError, KeyError):
            out.append("?")
    return out


@pytest.mark.integration
def test_a_lane_takes_the_early_launch_of_its_world_size_and_timeout(tmp_path):
    case = next(c for c in _cases(tmp_path) if c.target is None)
    launcher = Launcher(tmp_path / "launches", "torch", "cpu")
    launcher.early.start(2, {}, 20.0)  # L001: what the lane needs
    launcher.early.start(2, {}, 90.0)  # L002: other timeouts -- not taken
    launcher.early.start(4, {}, 20.0)  # L003: another world size -- not taken
    left = {ln.name: ln.tag for ln in launcher.early.waiting}
    (res,) = launcher.run_batch([Task(f"{case.key}.train", case, "train", tmp_path / "c")],
                                2).values()
    assert res.status == "ok" and res.rows and not res.errors, (res.status, res.errors)
    assert [(r.name, r.early, r.tasks) for r in launcher.records] == [("L001", "used", 1)]
    # the plan's timeouts are those of the lane's cases (collective: half the case timeout)
    plan = json.loads((tmp_path / "launches" / "L001" / "plan.json").read_text())
    assert (plan["collective_timeout_s"], plan["control_timeout_s"], plan["tasks"]) == \
        (10.0, 20.0, [])
    # the others set up and wait on their feed (bounded wait: world 4 on a loaded box is slow);
    # ended, they are recorded as unused and nothing of them survives
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and \
            any(_states(tmp_path, n) != ["idle"] * w for n, w in (("L002", 2), ("L003", 4))):
        time.sleep(0.2)
    launcher.early.discard()
    unused = {r.name: r for r in launcher.records[1:]}
    assert set(unused) == {"L002", "L003"} and launcher.early.waiting == []
    for name, rec in unused.items():
        assert (rec.early, rec.tasks, rec.leaked) == ("unused", 0, []), rec
        assert rec.returncode == -signal.SIGKILL, rec  # ended, not exited on its own
        assert _states(tmp_path, name) == ["idle"] * rec.world_size, name
        assert procs.tagged(left[name]) == []


@pytest.mark.integration
def test_pytest_starts_launches_early_and_ends_those_its_selection_does_not_need(tmp_path):
    d = tmp_path / "scen"
    d.mkdir()
    (d / "early.yaml").write_text(SCENARIO)
    p = subprocess.Popen(pytest_argv("--scenario", "early", "--scenario-dir", str(d),
                                     "-k", "not to_dp4", "--report-dir", str(tmp_path / "reports")),
                         cwd=tmp_path, env=harness_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0 and "1 passed" in out, out
    # world 4 (the reshard target; larger worlds first) and world 2 started while pytest
    # collected; -k left no case with a task on world 4
    assert "launches started early (while pytest collected or another lane ran): 1 taken by " \
           "a lane, 1 not needed (L001: no selected case of their world size)" in out, out
    # every process the run started is gone (their tags carry the pytest process's pid)
    mine = f"-{p.pid}-".encode()
    for pid in procs._pids():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        assert not any(v.startswith(procs.TAG_VAR.encode()) and mine in v
                       for v in environ.split(b"\0")), (pid, procs.cmdline(pid))
    # --no-early-launches: one launch, started when its lane had tasks
    rc, out = run_pytest(tmp_path, "--scenario", "early", "--scenario-dir", str(d), "-k",
                         "not to_dp4", "--no-report", "--no-early-launches", timeout=300)
    assert rc == 0 and "torchrun launches: 1 (1 x world 2)" in out, out
    assert "started early" not in out


def test_the_plugin_imports_neither_torch_nor_pandas():
    """Early launches start in pytest_configure: what the plugin imports before that delays
    them (torch and pandas took 2.4 s of the pytest process's start)."""
    code = ("import sys, harness.plugin; "
            "print(sorted(m for m in ('torch', 'pandas', 'pyarrow') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=harness_env())
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr
