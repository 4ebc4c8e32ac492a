"""A launch's set-up (process groups forming) is bounded by the set-up timeout, not by a case's
collective timeout -- and the collectives still run under theirs once the groups exist.

Seen in a clean-clone CI run: a world-4 launch of a scenario with ``timeout_s: 15`` (collective
timeout 7.5 s) failed before its first case, "DistStoreError: wait timeout after 7500ms, keys:
/default_pg/0//cpu//0/3" -- on this sandboxed VM one TCP connect on loopback in ten took exactly
5 s in a loop of connects to a TCPStore, so a rank could miss its peers' 7.5 s. Here rank 1
starts 5 s late (a ``sitecustomize`` on its path sleeps; fresh-Python ranks import it).

A launch that fails before its first task anyway runs its tasks again in a new launch, once;
twice in a row crashes them.
"""

import json

import pytest

from harness.launch.launcher import Launcher, Task
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario

SCENARIO = """\
name: late_rank
description: a case in a launch whose rank 1 starts late
axes:
  recipe: [fp32]
  mesh: [dp2]
  module: [Linear]
  dcp: [sync]
  reshard: [none]
timeout_s: 8
"""
LATE_S = 5.0  # > the collective timeout (8 / 2 = 4 s), < the set-up timeout


def _launcher_with_site(tmp_path, sitecustomize: str) -> Launcher:
    """A CPU launcher whose fresh-Python ranks run ``sitecustomize`` first (its directory is
    ``tmp_path / "site"``, on their path)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(sitecustomize)
    return Launcher(tmp_path / "launches", "torch", "cpu",
                    env={"PYTHONPATH": str(site)})


@pytest.mark.integration
def test_a_late_rank_joins_and_collectives_keep_their_timeout(tmp_path):
    launcher = _launcher_with_site(tmp_path, "import os, time\n"
                                             "if os.environ.get('RANK') == '1':\n"
                                             f"    time.sleep({LATE_S})\n")
    (tmp_path / "late_rank.yaml").write_text(SCENARIO)
    (case,) = expand(load_scenario(tmp_path / "late_rank.yaml"), "torch")
    (ok,) = launcher.run_batch([Task(f"{case.key}.train", case, "train", tmp_path / "ckpt")],
                               2).values()
    assert ok.status == "ok" and not ok.errors, (ok.status, ok.errors)
    assert ok.rows and not [r for r in ok.rows if r.get("status") == "failed"]
    assert [r.name for r in launcher.records] == ["L001"]  # no re-launch for the late rank
    # the groups formed under the set-up timeout, then took their collectives' timeouts (as
    # torch's gloo backends report them): a case's collective still gives up after 4 s
    (launch,) = launcher.records
    timelines = sorted((tmp_path / "launches" / launch.name / "progress").glob("timeline*"))
    assert len(timelines) == 2
    for p in timelines:
        assert json.loads(p.read_text())["group_timeouts_s"] == {
            "main": 4.0, "control": 8.0, "exchange": 4.0, "async": 4.0}, p.name


def _run_with_failing_starts(tmp_path, times: int):
    """Two cases (one raising inside its case) in a lane whose rank 1 exits before its process
    group forms, in the first ``times`` launches (a ``sitecustomize`` counts them in files
    beside itself). Returns (launcher, results)."""
    site = tmp_path / "site"
    launcher = _launcher_with_site(
        tmp_path,
        "import os\n"
        "if os.environ.get('RANK') == '1':\n"
        f"    n = len(os.listdir({str(site)!r})) - 1\n"
        f"    if n < {times}:\n"
        f"        open(os.path.join({str(site)!r}, f'failed{{n}}'), 'w').close()\n"
        "        os._exit(5)\n")
    (tmp_path / "late_rank.yaml").write_text(SCENARIO.replace(
        "  reshard: [none]\n", "  reshard: [none]\n  fault: [none, raise]\n"))
    cases = expand(load_scenario(tmp_path / "late_rank.yaml"), "torch")
    tasks = [Task(f"{c.key}.train", c, "train", tmp_path / f"ckpt{i}") for i, c in enumerate(cases)]
    return launcher, launcher.run_batch(tasks, 2)


@pytest.mark.integration
def test_a_launch_that_fails_before_its_first_task_runs_again_once(tmp_path):
    launcher, results = _run_with_failing_starts(tmp_path, times=1)
    assert [r.start_failed for r in launcher.records] == ["retried", ""]
    assert all(r.status == "ok" for r in results.values()), {n: r.errors for n, r in results.items()}
    assert len(results) == 2


@pytest.mark.integration
def test_a_launch_that_never_starts_crashes_its_cases_after_one_retry(tmp_path):
    launcher, results = _run_with_failing_starts(tmp_path, times=99)
    assert [r.start_failed for r in launcher.records] == ["retried", "reported"]
    assert len(results) == 2
    for r in results.values():
        assert r.status == "crash" and "before any task started (twice in a row" in r.errors[-1]


class _Lines:
    def __init__(self):
        self.lines = []

    def write_line(self, text, **markup):
        self.lines.append(text)


def test_the_terminal_names_launches_that_ran_again():
    from harness.results import run_record
    rec = dict(name="L001", world_size=2, started=0.0, ended=5.0, phases={})
    tr = _Lines()
    run_record._launches(tr, [{**rec, "start_failed": "retried"},
                              {**rec, "name": "L002", "start_failed": ""}], 10.0)
    assert any("failed before their first task" in line and "L001" in line
               and "L002" not in line for line in tr.lines), tr.lines
    tr = _Lines()
    run_record._launches(tr, [{**rec, "name": "L002"}], 10.0)  # records of older runs
    assert not any("failed before" in line for line in tr.lines)
