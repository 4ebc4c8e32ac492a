"""Checkpoint faults (harness/worker/ckpt_faults.py): a rank killed halfway through writing its
shard (sync and async_thread), the async_process stager killed, a shard file truncated after the
save, ``.metadata`` removed, ENOSPC from the writer. Each case must end with a clear error
naming the checkpoint and what is wrong, nothing may be loaded from the broken checkpoint, the
case after it (in the same batch) must pass, and no process may survive. The ranks fork from a
rank server, as a run's do by default (the fresh path's faults: test_no_leaks, test_interrupt).
"""

import os
import signal

import pytest
from forked import rank_server
from proc_sampler import Sampler

from harness.launch.launcher import Launcher
from harness.launch.scheduler import Scheduler
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario

SCENARIO = """\
name: ckpt_faults
description: checkpoint faults, each followed by a clean case of the same batch
axes:
  recipe: [fp32]
  mesh: [dp2]
  module: [Linear]
  dcp: [sync, async_thread, async_process]
  reshard: [none]
  fault: [kill_mid_save, kill_stager, truncate_shard, missing_metadata, enospc, none]
cases:
  - {dcp: [sync, async_thread], fault: kill_mid_save}
  - {dcp: async_process, fault: [kill_stager, none]}
  - {dcp: sync, fault: [truncate_shard, missing_metadata, enospc, none]}
checks: [dcp_roundtrip]
timeout_s: 40
"""


def _unit(res, unit):
    rows = [r for r in res.rows if r["check"] == unit and r["metric"] == "coverage"]
    assert rows, f"no coverage row for {unit}: {[r['check'] for r in res.rows]}"
    return rows[0]


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt_faults")
    (tmp / "ckpt_faults.yaml").write_text(SCENARIO)
    cases = expand(load_scenario(tmp / "ckpt_faults.yaml"), "torch")
    # a lane per DCP mode (three at once): the crashes' relaunches overlap
    # (the server's own process is sampled too: it must be gone after its stop like the rest)
    with Sampler(tmp / "launches") as sampler, rank_server("torch") as server:
        launcher = Launcher(tmp / "launches", "torch", "cpu", rank_server=server)
        with Scheduler(launcher, cases, tmp / "ckpt", lambda c: c.ax["dcp"]) as sched:
            results = {(c.ax["dcp"], c.ax["fault"]): sched.result(c) for c in cases}
    survivors = sampler.survivors()
    for pid in survivors:  # never leave them running, even when the test fails
        os.kill(pid, signal.SIGKILL)
    return results, survivors, launcher, tmp / "ckpt"


@pytest.mark.integration
@pytest.mark.parametrize("dcp", ["sync", "async_thread"])
def test_rank_killed_mid_save_is_a_crash_naming_the_unit_and_checkpoint(outcome, dcp):
    res = outcome[0][(dcp, "kill_mid_save")]
    assert res.status == "crash"
    text = "\n".join(res.errors)
    assert "rank 1 killed by SIGKILL" in text, text[:3000]
    assert "rank 1 in save" in text and str(outcome[3] / res.case.key) in text, text[:3000]


@pytest.mark.integration
def test_stager_killed_fails_the_save_and_nothing_loads(outcome):
    res = outcome[0][("async_process", "kill_stager")]
    assert res.status == "ok", res.errors
    save = _unit(res, "save")
    assert save["outcome"] == "failed"
    assert "async_process save to" in save["detail"] and "/main" in save["detail"]
    assert "stager process" in save["detail"] or "did not finish" in save["detail"], save
    load = _unit(res, "load")
    assert load["outcome"] == "not_run" and "checkpoint" in load["detail"], load
    assert _unit(res, "dcp_roundtrip")["outcome"] == "not_run"


@pytest.mark.integration
@pytest.mark.parametrize("fault, says", [
    ("truncate_shard", r"shard file __1_0.distcp holds \d+ bytes, but .metadata places data "
                       r"up to byte \d+ \(truncated\)"),
    ("missing_metadata", r"has no .metadata"),
])
def test_broken_checkpoint_is_refused_by_the_load(outcome, fault, says):
    import re
    res = outcome[0][("sync", fault)]
    assert res.status == "ok", res.errors
    assert _unit(res, "save")["outcome"] == "passed"
    load = _unit(res, "load")
    assert load["outcome"] == "failed"
    assert re.search(says, load["detail"]), load["detail"]
    assert f"checkpoint {outcome[3] / res.case.key / 'main'}" in load["detail"], load["detail"]
    assert _unit(res, "dcp_roundtrip")["outcome"] == "not_run"


@pytest.mark.integration
def test_enospc_fails_the_save_naming_the_file(outcome):
    res = outcome[0][("sync", "enospc")]
    assert res.status == "ok", res.errors
    save = _unit(res, "save")
    assert save["outcome"] == "failed"
    assert "No space left on device" in save["detail"], save["detail"]
    assert "__1_0.distcp" in save["detail"] and "save to" in save["detail"], save["detail"]
    assert _unit(res, "load")["outcome"] == "not_run"


@pytest.mark.integration
def test_clean_cases_after_the_faults_pass_and_nothing_leaks(outcome):
    results, survivors, launcher, _ = outcome
    for dcp in ("async_process", "sync"):
        res = results[(dcp, "none")]
        assert res.passed, (dcp, res.errors, res.failed_rows)
    assert survivors == {}
    assert all(r.leaked == [] for r in launcher.records), [r.leaked for r in launcher.records]
