"""``HARNESS_PROFILE_DIR`` (reports/bench/README.md, "Where the CPU goes"): every rank writes a
cProfile of its run and its CPU seconds beside it, so a benchmark can say how much of the host's
cores the ranks used, not only how long they took."""

import json
import os
import pstats
import subprocess

import pytest
from subprocs import harness_env, one_case_scenario, pytest_argv

@pytest.mark.integration
def test_each_rank_writes_its_profile_and_cpu_seconds(tmp_path):
    scen = one_case_scenario(tmp_path, "profiled", "one case, profiled")
    prof = tmp_path / "prof"
    env = {**harness_env(), "HARNESS_PROFILE_DIR": str(prof)}
    p = subprocess.run(pytest_argv("--scenario", "profiled", "--scenario-dir", str(scen),
                                   "--report-dir", str(tmp_path / "reports"), "-q"),
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "1 passed" in p.stdout, p.stdout + p.stderr
    profiles = sorted(prof.glob("*.prof"))
    assert [f.name.split("-")[-1] for f in profiles] == ["rank0.prof", "rank1.prof"]
    for f in profiles:
        stats = pstats.Stats(str(f))
        assert any(fn[2] == "run_task" for fn in stats.stats), f  # the tasks ran profiled
        cpu = json.loads(f.with_suffix(".cpu.json").read_text())
        assert cpu["user_s"] > 0.5 and cpu["sys_s"] >= 0, cpu  # at least torch's import
        assert 0 < cpu["user_s"] + cpu["sys_s"] < cpu["wall_s"] * os.cpu_count(), cpu
