"""A passing run is quiet (issue 29): nothing on stderr, no C++ stack anywhere on the terminal.
Torch's teardown noise of its store, NCCL and gloo (``TCPStore.cpp ... recvValue failed ...
Connection reset by peer`` and ~50 lines of C++ frames) belongs in the launch logs: every process
of a launch writes to ``torchrun.log`` or its rank's log, never to pytest's terminal. The case
here ends its launch with a process-staged async DCP helper alive (whose store connection the
launch's end resets)."""

import subprocess

import pytest
from subprocs import harness_env, one_case_scenario, pytest_argv

NOISE = ("TCPStore", "recvValue", "Connection reset by peer", "Exception raised from",
         "frame #", "[W", "[E", "Traceback")


@pytest.mark.integration
def test_a_passing_run_prints_nothing_on_stderr(tmp_path):
    scen = one_case_scenario(tmp_path, "quiet", "a passing run's terminal", dcp="async_process")
    p = subprocess.run(pytest_argv("--scenario", "quiet", "--scenario-dir", str(scen),
                                   "--report-dir", str(tmp_path / "reports"), "-q"),
                       cwd=tmp_path, env=harness_env(), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "1 passed" in p.stdout, p.stdout + p.stderr
    assert p.stderr == "", p.stderr
    assert not [w for w in NOISE if w in p.stdout], p.stdout
    logs = list((tmp_path / "reports" / "runs").glob("*/launches/L*/logs/rank*.log"))
    assert len(logs) == 2, logs  # what the ranks said is kept, in the launch logs


@pytest.mark.integration
def test_a_k_subset_is_quiet_about_entries_of_deselected_cases(tmp_path):
    """Issue 61: ``-k`` running one case of two printed a long warning for each registry entry
    whose cases were merely deselected. Now only an entry selecting no case of the matrix
    gets one short line."""
    scen = tmp_path / "scen"
    scen.mkdir()
    (scen / "pair.yaml").write_text(
        "name: pair\ndescription: two cases\naxes:\n  recipe: [fp32, bf16]\n  mesh: [dp2]\n"
        "  module: [Linear]\n  dcp: [sync]\n  reshard: [none]\ntimeout_s: 120\n")
    (scen / "xfails.yaml").write_text(
        "entries:\n"
        "  - match: {scenario: pair, recipe: bf16}\n    fails: {check: train}\n"
        "    reason: DESELECTED-REASON\n"
        "  - match: {scenario: pair, mesh: dp8}\n    fails: {check: train}\n"
        "    reason: STALE-REASON\n")
    p = subprocess.run(pytest_argv("--scenario", "pair", "--scenario-dir", str(scen),
                                   "--report-dir", str(tmp_path / "reports"), "-q",
                                   "-k", "fp32"),
                       cwd=tmp_path, env=harness_env(), capture_output=True, text=True,
                       timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "1 passed" in p.stdout, out
    assert "DESELECTED-REASON" not in out and "entry 1 " not in out, out
    [line] = [ln for ln in out.splitlines() if "xfail entry 2" in ln]
    assert "selects no case of the scenarios it names (scenario: pair, mesh: dp8)" in line
    assert "STALE-REASON" not in out and len(line) < 250, line
