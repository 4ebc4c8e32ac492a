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
