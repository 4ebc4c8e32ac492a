"""Two ``pytest --scenario`` runs at once in one project directory: distinct run ids, no port
or path collision, both histories complete."""

import pytest
from subprocs import harness_env, pytest_argv, run_all

from harness.report import history

SCENARIO = """\
name: duo
description: concurrency self-test
axes:
  recipe: [fp32]
  mesh: [dp2]
  module: [Linear]
  dcp: [async_thread]
  reshard: [none]
timeout_s: 120
"""


@pytest.mark.integration
def test_two_runs_at_once_in_one_project(tmp_path):
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "duo.yaml").write_text(SCENARIO)
    argv = pytest_argv("--scenario", "duo")
    for rc, out in run_all([argv, argv], timeout=300, cwd=tmp_path, env=harness_env()):
        assert rc == 0, out
    files = sorted((tmp_path / "reports" / "history").iterdir())
    assert len(files) == 2, files  # two runs, two complete histories, no temporaries
    ids = set()
    for f in files:
        df, meta = history.read_run(f)
        ids.add(meta["run_id"])
        cases = df[df["check"] == "case"]
        assert list(cases["case_outcome"]) == ["passed"]
        run_dir = tmp_path / "reports" / "runs" / meta["run_id"]
        assert sorted(p.name for p in run_dir.iterdir()) == ["launches", "meta.json",
                                                              "summary.csv"]
    assert len(ids) == 2
