"""One train phase for the DCP modes of a case (the ``mode_group`` layer): the task graph
groups the train tasks that differ only in their DCP mode (launch/task_graph.py), the worker
puts the trained run back in place for each further mode (distributed/restore_point.py) and
keeps that mode's result only where its saved state and next step equal the first mode's bit
for bit, else trains its own (worker/mode_group.py). With the layer off every case gets the
same rows."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from subprocs import ROOT, harness_env

from harness.distributed import restore_point
from harness.launch import launch_dir
from harness.launch.task_graph import TaskGraph, mode_free_key
from harness.launch.tasks import TaskResult
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario
from harness.worker import mode_group

SCENARIO = """\
name: modes
description: one group of three DCP modes (one resharding), and a pair whose restore drifts
axes:
  recipe: [delayed]
  mesh: [dp2]
  module: [LayerNormMLP]
  dcp: [sync, async_thread, async_process]
  reshard: [none, to_dp4]
  fault: [none, restore_drift, perturb_loaded]
cases:
  - {dcp: [sync, async_thread, async_process], reshard: none, fault: none}
  - {dcp: sync, reshard: to_dp4, fault: none}
  - {dcp: [sync, async_thread], reshard: none, fault: restore_drift}
  - {dcp: async_thread, reshard: none, fault: perturb_loaded}
timeout_s: 240
"""


@pytest.fixture(scope="module")
def scen(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("scen")
    (d / "modes.yaml").write_text(SCENARIO)
    return d


def _cases(scen):
    return {"-".join(c.label.split("-")[3:]): c
            for c in expand(load_scenario(scen / "modes.yaml"), "reference")}


def test_the_train_tasks_of_a_world_that_differ_only_in_their_mode_form_a_group(scen, tmp_path):
    cs = _cases(scen)
    g = TaskGraph(list(cs.values()), Path("/ckpt"), lambda c: "all", group_modes=True)
    sync = g.tasks[cs["sync-none-none"].key][0]
    assert g.tasks[cs["sync-to_dp4-none"].key][0] is sync  # the reshard case shares it
    assert [m.case.ax["dcp"] for m in sync.members] == ["async_thread", "async_process"]
    assert all(m.leader == sync.name for m in sync.members)
    drift = g.tasks[cs["sync-none-restore_drift"].key][0]
    assert [m.case.key for m in drift.members] == [cs["async_thread-none-restore_drift"].key]
    assert mode_free_key(cs["async_thread-none-perturb_loaded"]) is None  # a fault: its own
    assert not g.tasks[cs["async_thread-none-perturb_loaded"].key][0].leader
    # one batch: the first task, its same-world followers (none here) and its members
    batches = g.ready(g.keys()[-1], set())
    first = next(b for b in batches if b[0] is sync)
    assert [t.name for t in first] == [sync.name] + [m.name for m in sync.members]
    assert not any(b[0] in sync.members for b in batches)
    assert g.batches({t.name for t in first}) == 1
    assert sync.to_json()["members"][0]["name"] == sync.members[0].name
    # a member resolved without a lane (cancelled: a sibling variant timed out) leaves the
    # batch, and the first task's plan no longer hands it to the ranks
    gone = sync.members[0]
    g.done[gone.name] = TaskResult(gone.name, "cancelled", errors={-1: "cancelled"})
    again = next(b for b in g.ready(g.keys()[-1], set()) if b[0] is sync)
    assert [t.name for t in again] == [sync.name, sync.members[1].name]
    plan = json.loads(launch_dir.write_plan(tmp_path, again, "reference", "cpu", 60).read_text())
    assert [m["name"] for m in plan["tasks"][0]["members"]] == [sync.members[1].name]
    launch_dir.feed(tmp_path, 1, again)
    fed = json.loads((tmp_path / "queue" / "000001.json").read_text())
    assert [m["name"] for m in fed[0]["members"]] == [sync.members[1].name]
    plain = TaskGraph(list(cs.values()), Path("/ckpt"), lambda c: "all")
    assert not any(t.members or t.leader for t in plain.all)


def test_a_mode_that_checks_the_trained_model_otherwise_trains_its_own(scen):
    """Such a check would run after the mode's save, on the stepped run."""
    from types import SimpleNamespace

    from harness import backends, checks
    ctx = SimpleNamespace(backend=backends.get("reference"))
    member = _cases(scen)["async_thread-none-none"]
    task = {"case": member.to_json()}
    mine = {c.name for c in checks.for_case(ctx.backend, member) if c.phase == "train"}
    leader = mode_group.Leader()
    leader.checked = tuple(mine)
    assert mode_group._other_checks(ctx, leader, task) is None
    leader.checked = tuple(mine - {"fp32_parity"})
    assert mode_group._other_checks(ctx, leader, task) == \
        "it checks the trained model by fp32_parity, the first mode not"
    leader.checked = tuple(mine - {"async_equivalence"})  # a check of its save: its own
    assert mode_group._other_checks(ctx, leader, task) is None


class _Run:
    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        self.model.extra = {"history": [torch.zeros(2)]}  # containers a step rebinds
        self.optim = torch.optim.Adam(self.model.parameters(), lr=0.1)
        self.backend = type("B", (), {"global_state": lambda self: []})()

    def step(self):
        loss = self.model(torch.ones(2, 4)).square().sum()
        loss.backward()
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)
        self.model.extra["history"].insert(0, loss.detach().reshape(1).repeat(2))
        return loss.item()

    def state(self):
        return {**{f"m.{k}": v.clone() for k, v in self.model.state_dict().items()},
                **{f"o.{i}.{k}": v.clone() for i, s in enumerate(self.optim.state.values())
                   for k, v in s.items()}, "h": len(self.model.extra["history"])}


def test_a_restore_point_puts_the_run_back_and_a_missed_part_is_found():
    run = _Run()
    run.step()
    point, before = restore_point.take(run), run.state()
    next_loss = run.step()
    run.step()
    point.restore()
    assert mode_group._differs(run.state(), before, "state") is None
    assert run.step() == next_loss  # the same next step, bit for bit
    # the optimizer left out of the walk: its moments are not put back, and that is found
    partial = restore_point.RestorePoint()
    partial.walk(run.model)
    run.step()
    partial.restore()
    assert mode_group._differs(run.state(), _state_after(2), "state") == "state: o.0.step differs"
    # one ulp is a difference
    a = {"w": torch.ones(3)}
    b = {"w": torch.nextafter(torch.ones(3), torch.full((3,), 2.0))}
    assert mode_group._differs(a, b, "saved state") == "saved state: w differs"
    assert mode_group._differs({"x": float("nan")}, {"x": float("nan")}, "s") is None


class _GlobalState:
    """Like TE's FP8 state manager: process-global state held by a class, rebound by reset."""
    buffers = {"amax": [torch.zeros(2)]}

    @classmethod
    def reset(cls):
        cls.buffers = {"amax": []}


def test_a_restore_point_puts_back_a_class_held_global_state_rebound_since():
    run = _Run()
    run.backend = type("B", (), {"global_state": lambda self: [_GlobalState]})()
    before = _GlobalState.buffers
    point = restore_point.take(run)
    before["amax"][0].add_(1.0)
    before["amax"].append(torch.ones(2))
    _GlobalState.reset()
    point.restore()
    assert _GlobalState.buffers is before and len(before["amax"]) == 1
    assert torch.equal(before["amax"][0], torch.zeros(2))


def _state_after(steps):
    run = _Run()
    for _ in range(steps):
        run.step()
    return run.state()


def _rows(tmp_path: Path, scen: Path, acc: str) -> pd.DataFrame:
    store = tmp_path / acc
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "harness.plugin", "--scenario",
                        "modes", "--scenario-dir", str(scen), "--backend", "reference",
                        "--report-dir", str(store), "--accelerations", acc,
                        "-k", "not perturb_loaded", "-o", f"cache_dir={tmp_path / 'cache'}"],
                       cwd=ROOT, env=harness_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (history,) = (store / "history").glob("*.parquet")
    return pd.read_parquet(history)


@pytest.mark.integration
def test_every_mode_gets_the_rows_its_own_training_gives(tmp_path, scen):
    on = _rows(tmp_path, scen, "all")
    off = _rows(tmp_path, scen, "all,-mode_group")
    notes = on[on.quantity.str.startswith("mode_group")].set_index("case_id").detail
    shared = notes[notes.str.startswith("trained once with")]
    assert {i.split("[")[1].split("-")[3] for i in shared.index} == {"async_thread",
                                                                     "async_process"}
    assert shared.str.contains("async_equivalence compares with that case's sync").all()
    [own] = notes[notes.str.startswith("trained a run of its own")]
    assert "differed: rank 0: saved state:" in own, own
    assert not off.quantity.str.startswith("mode_group").any()
    key = ["case_id", "phase", "check", "quantity", "metric"]
    on, off = (d[~d.quantity.str.startswith("mode_group") & (d.quantity != "time") &
                 (d.metric != "duration_s")].set_index(key).sort_index() for d in (on, off))
    assert on.index.equals(off.index)
    for col in ("case_outcome", "row_outcome", "tolerance", "detail"):
        pd.testing.assert_series_equal(on[col], off[col], check_exact=True)
    pd.testing.assert_series_equal(on["value"], off["value"], check_exact=True)
    assert set(on["case_outcome"]) == {"passed"}


def test_a_mode_that_falls_back_to_its_own_run_gets_its_whole_timeout(monkeypatch):
    """A member whose run from the trained state differed trains its own; the watchdog's clock
    (``start``) starts again for that run, which else inherits the attempt's seconds and may
    time out where the plain path would not."""
    log = []
    monkeypatch.setattr(mode_group, "_all", lambda ctx, ok: ok)
    monkeypatch.setattr(mode_group, "_other_checks", lambda ctx, leader, m: None)
    monkeypatch.setattr(mode_group, "_first", lambda ctx, why: why)
    monkeypatch.setattr(mode_group, "_empty", lambda ctx, d: None)
    monkeypatch.setattr(mode_group.Leader, "usable", lambda self: True)
    monkeypatch.setattr(mode_group.Member, "differs", lambda self: "saved state differs")

    def run_task(ctx, task, plan, share=None):
        log.append(("run", task["name"], type(share).__name__))
        return dict(task=task["name"], case_key="K", pg_broken=False, errors={})
    task = dict(name="first", members=[dict(name="m", ckpt_dir="/nonexistent")])
    got = list(mode_group.results(None, task, {}, run_task, lambda n: log.append(("start", n))))
    assert [r["task"] for r in got] == ["first", "m"]
    assert log == [("start", "first"), ("run", "first", "Leader"), ("start", "m"),
                   ("run", "m", "Member"), ("start", "m"), ("run", "m", "OwnRun")]
