"""What the environment tells a rank about its run, on a real one-case run (one launch, two
ranks): ``HARNESS_PROFILE_DIR`` (a9e4b78:reports/bench/README.md, "Where the CPU goes") --
every rank writes a cProfile of its run and its CPU seconds beside it, so a benchmark can say
how much of the host's cores the ranks used, not only how long they took; ``HARNESS_NICE``
(launch/placement.py cpu_priority) -- the rank runs at that nice value and records it."""

import json
import os
import pstats
import subprocess

import pytest
from subprocs import harness_env, one_case_scenario, pytest_argv

from harness.worker.main import NICE_VAR

NICE = 3


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("profiled")
    scen = one_case_scenario(tmp_path, "profiled", "one case, profiled")
    prof = tmp_path / "prof"
    env = {**harness_env(), "HARNESS_PROFILE_DIR": str(prof), NICE_VAR: str(NICE)}
    p = subprocess.run(pytest_argv("--scenario", "profiled", "--scenario-dir", str(scen),
                                   "--report-dir", str(tmp_path / "reports"), "-q"),
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "1 passed" in p.stdout, p.stdout + p.stderr
    return tmp_path


@pytest.mark.integration
def test_each_rank_writes_its_profile_and_cpu_seconds(profiled):
    profiles = sorted((profiled / "prof").glob("*.prof"))
    assert [f.name.split("-")[-1] for f in profiles] == ["rank0.prof", "rank1.prof"]
    for f in profiles:
        stats = pstats.Stats(str(f))
        assert any(fn[2] == "run_task" for fn in stats.stats), f  # the tasks ran profiled
        cpu = json.loads(f.with_suffix(".cpu.json").read_text())
        # the case's work (a forked rank's own CPU: torch was imported before the fork)
        assert cpu["user_s"] > 0.05 and cpu["sys_s"] >= 0, cpu
        assert 0 < cpu["user_s"] + cpu["sys_s"] < cpu["wall_s"] * os.cpu_count(), cpu


@pytest.mark.integration
def test_ranks_run_at_the_nice_value_they_are_given(profiled):
    timelines = sorted(profiled.glob("reports/runs/*/launches/L*/progress/timeline*.json"))
    assert len(timelines) == 2, timelines
    ours = os.nice(0)  # pytest's own; the ranks' value is relative to their parent's
    assert [json.loads(t.read_text())["nice"] for t in timelines] == [min(19, ours + NICE)] * 2
