"""Ranks forked from an agent that imported their modules (harness/fork_agent.py, the default on
CPU) against torchrun's fresh Python per rank: the same results to the bit, the imports shared,
each rank named, and a rank's death still named with its signal."""

import json

import pytest

from harness import launch_dir
from harness.launcher import Launcher, Task
from harness.matrix import expand
from harness.spec import load_scenario

SCENARIO = """\
name: forked
description: one small case, trained, saved, loaded and checked
axes:
  recipe: [fp32]
  mesh: [dp2]
  module: [LayerNormMLP]
  dcp: [sync]
  reshard: [none]
timeout_s: 120
"""


def _run(tmp_path, rank_start: str):
    (tmp_path / "forked.yaml").write_text(SCENARIO)
    (case,) = expand(load_scenario(tmp_path / "forked.yaml"), "torch")
    launcher = Launcher(tmp_path / rank_start, "torch", "cpu", rank_start=rank_start)
    task = Task(f"{case.key}.train", case, "train", tmp_path / f"ckpt-{rank_start}")
    (result,) = launcher.run_batch([task], 2).values()
    (launch,) = launcher.records
    timelines = [json.loads(p.read_text())
                 for p in (tmp_path / rank_start / launch.name / "progress").glob("timeline*")]
    torchrun_log = (tmp_path / rank_start / launch.name / "torchrun.log").read_text()
    return result, timelines, torchrun_log


def _values(result) -> dict:
    return {(r["check"], r.get("quantity"), r.get("metric"), r.get("rank")): r.get("value")
            for r in result.rows if r.get("quantity") != "time"}


@pytest.mark.integration
def test_forked_ranks_give_the_fresh_ranks_results_bit_for_bit(tmp_path):
    forked, forked_lines, _ = _run(tmp_path, "fork")
    fresh, fresh_lines, _ = _run(tmp_path, "fresh")
    assert forked.status == fresh.status == "ok", (forked.errors, fresh.errors)
    assert not [r for r in forked.rows if r.get("status") == "failed"]
    values = _values(forked)
    assert len(values) > 20 and values == _values(fresh)  # losses, norms, round trips
    assert [t["torch_imported_at_start"] for t in forked_lines] == [True, True]
    assert [t["torch_imported_at_start"] for t in fresh_lines] == [False, False]


def test_a_forked_ranks_death_is_named_with_its_signal():
    """torchrun's summary of forked ranks names only the first failure; the agent's own line
    per failed process names the others (the pid mapped to its rank)."""
    log = ("harness.fork_agent: process 4242 exitcode: -9\n"
           "harness.fork_agent: process 4243 exitcode: 1\n"
           "harness.fork_agent: process 999 exitcode: 1\n")  # not a rank of this launch
    assert launch_dir.rank_exits(log, {4242: 1, 4243: 0}) == {
        1: "killed by SIGKILL", 0: "exit code 1"}
    summary = "[1]:\n  time      : x\n  host      : h\n  rank      : 3 (local_rank: 3)\n" \
              "  exitcode  : -6 (pid: 77)\n"
    assert launch_dir.rank_exits(summary) == {3: "killed by SIGABRT"}


def test_rank_start_is_checked(tmp_path):
    with pytest.raises(ValueError, match="rank_start 'spawn'"):
        Launcher(tmp_path, "torch", "cpu", rank_start="spawn")
    assert Launcher(tmp_path, "torch", "cpu").fork_ranks
    assert not Launcher(tmp_path, "te", "cuda").fork_ranks
    assert Launcher(tmp_path, "te", "cuda", rank_start="fork").fork_ranks
    cmd = Launcher(tmp_path, "torch", "cpu", rank_start="fresh").commands(tmp_path / "p", 2, "L1")
    assert "torch.distributed.run" in cmd[0] and "harness.fork_agent" not in cmd[0]
