"""A passing run is quiet (issue 29): nothing on stderr, no C++ stack anywhere on the terminal.
Torch's teardown noise of its store, NCCL and gloo (``TCPStore.cpp ... recvValue failed ...
Connection reset by peer`` and ~50 lines of C++ frames) belongs in the launch logs: every process
of a launch writes to ``torchrun.log`` or its rank's log, never to pytest's terminal. The case
here ends its launch with a process-staged async DCP helper alive (whose store connection the
launch's end resets). One ``-k`` run of one case of two serves both tests: quiet, and quiet
about the registry entries of the case it deselected."""

import subprocess

import pytest
from subprocs import harness_env, pytest_argv

NOISE = ("TCPStore", "recvValue", "Connection reset by peer", "Exception raised from",
         "frame #", "[W", "[E", "Traceback")

# two cases, one selected by -k; a registry entry of the deselected case and one that selects
# no case of the matrix at all
SCENARIO = """\
name: pair
description: two cases, a process-staged async DCP save each
axes:
  recipe: [fp32, bf16]
  mesh: [dp2]
  module: [Linear]
  dcp: [async_process]
  reshard: [none]
timeout_s: 120
"""
XFAILS = """\
entries:
  - match: {scenario: pair, recipe: bf16}
    fails: {check: train}
    reason: DESELECTED-REASON
  - match: {scenario: pair, mesh: dp8}
    fails: {check: train}
    reason: STALE-REASON
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One passing ``-k`` run of one case of two, shared by the tests below: (process, out)."""
    tmp = tmp_path_factory.mktemp("quiet")
    scen = tmp / "scen"
    scen.mkdir()
    (scen / "pair.yaml").write_text(SCENARIO)
    (scen / "xfails.yaml").write_text(XFAILS)
    p = subprocess.run(pytest_argv("--scenario", "pair", "--scenario-dir", str(scen),
                                   "--report-dir", str(tmp / "reports"), "-q", "-k", "fp32"),
                       cwd=tmp, env=harness_env(), capture_output=True, text=True, timeout=300)
    return p, tmp / "reports"


@pytest.mark.integration
def test_a_passing_run_prints_nothing_on_stderr(run):
    p, reports = run
    assert p.returncode == 0 and "1 passed" in p.stdout, p.stdout + p.stderr
    assert p.stderr == "", p.stderr
    assert not [w for w in NOISE if w in p.stdout], p.stdout
    logs = list((reports / "runs").glob("*/launches/L*/logs/rank*.log"))
    assert len(logs) == 2, logs  # what the ranks said is kept, in the launch logs


@pytest.mark.integration
def test_a_k_subset_is_quiet_about_entries_of_deselected_cases(run):
    """Issue 61: ``-k`` running one case of two printed a long warning for each registry entry
    whose cases were merely deselected. Now only an entry selecting no case of the matrix
    gets one short line."""
    p, _ = run
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "1 passed" in p.stdout, out
    assert "DESELECTED-REASON" not in out and "entry 1 " not in out, out
    [line] = [ln for ln in out.splitlines() if "xfail entry 2" in ln]
    assert "selects no case of the scenarios it names (scenario: pair, mesh: dp8)" in line
    assert "STALE-REASON" not in out and len(line) < 250, line
