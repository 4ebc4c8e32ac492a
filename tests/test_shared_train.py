"""Train phases shared between cases (harness/launch/task_graph.py): a resharding case whose
train phase another case of the run has too -- the same case but for the target -- loads that
case's checkpoint instead of training the same model again, and its result holds that train
task's rows with a note naming the case. Cases whose train phases differ (a fault, a train
producer's workaround, a TP target, another scope) keep their own."""

import dataclasses
from pathlib import Path

import pytest
from forked import FORK
from subprocs import run_pytest

from harness.checks.base import Check
from harness.launch.case_result import assemble, not_run_reshard
from harness.launch.task_graph import TaskGraph
from harness.launch.tasks import TaskResult
from harness.spec.catalog import SHARED_TRAIN_PHASE as SHARED
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario
from harness.worker.runner import producers_for

SCENARIO = Path(__file__).resolve().parent / "scenarios" / "shared_train.yaml"


@pytest.fixture(scope="module")
def cases():
    return {c.label.replace("fp32-dp2-LayerNormMLP-sync-", ""): c
            for c in expand(load_scenario(SCENARIO), "torch")}


def _graph(cs, scope=lambda c: "all"):
    return TaskGraph(list(cs), Path("/ckpt"), scope)


def test_resharding_cases_share_the_train_task_of_the_case_without_target(cases):
    none, dp4, hsdp = cases["none-none"], cases["to_dp4-none"], cases["to_hsdp2x1-none"]
    g = _graph(cases.values())
    [train] = g.tasks[none.key]
    assert g.tasks[dp4.key][0] is train and g.tasks[hsdp.key][0] is train
    assert train.for_reshard and train.ckpt_dir == Path("/ckpt") / none.key
    assert g.tasks[dp4.key][1].ckpt_dir == train.ckpt_dir  # the reshard loads its checkpoint
    assert g.shared_with == {dp4.key: none, hsdp.key: none}
    # the fault changes the train phase: that case trains itself
    faulted = cases["to_dp4-perturb_loaded"]
    own = g.tasks[faulted.key][0]
    assert own.case is faulted and own.for_reshard and faulted.key not in g.shared_with
    assert [t.name for t in g.all].count(train.name) == 1
    assert sum(t.phase == "train" for t in g.all) == 2  # 4 cases, 2 trainings


def test_without_the_case_to_share_with_a_resharding_case_trains_itself(cases):
    dp4 = cases["to_dp4-none"]
    g = _graph([dp4])
    [train, reshard] = g.tasks[dp4.key]
    assert train.case is dp4 and train.for_reshard and not g.shared_with
    assert reshard.ckpt_dir == train.ckpt_dir == Path("/ckpt") / dp4.key
    # a case without target and nothing loading its checkpoint does not save for a reshard
    assert not _graph([cases["none-none"]]).all[0].for_reshard


@pytest.mark.parametrize("change, shares", [
    (dict(workarounds=(("reshard_load", "load_without_extra_state"),)), True),
    (dict(workarounds=(("load", "load_without_extra_state"),)), False),
    (dict(marks=("ci",)), True),  # a pytest mark selects cases; it trains nothing
    (dict(axes_reshard="to_dp2xtp2"), False),  # a TP target: the backend may set TP up
    (dict(scope="other"), False),
])
def test_what_makes_train_phases_differ(cases, change, shares):
    none, dp4 = cases["none-none"], cases["to_dp4-none"]
    if "workarounds" in change:
        dp4 = dataclasses.replace(dp4, workarounds=change["workarounds"])
    if "marks" in change:
        dp4 = dataclasses.replace(dp4, marks=change["marks"])
    if "axes_reshard" in change:
        dp4 = dataclasses.replace(dp4, axes=tuple(
            (a, change["axes_reshard"] if a == "reshard" else v) for a, v in dp4.axes))
    scope = (lambda c: change["scope"] if c.target else "all") if "scope" in change \
        else (lambda c: "all")
    g = _graph([none, dp4], scope)
    assert (dp4.key in g.shared_with) == shares
    assert (none.train_key == dp4.train_key) == (shares or "scope" in change)


def test_ready_and_results_of_a_shared_train_task(cases):
    none, dp4, hsdp = cases["none-none"], cases["to_dp4-none"], cases["to_hsdp2x1-none"]
    g = _graph([none, dp4, hsdp])
    train = g.tasks[none.key][0]
    # the 2-rank key: the train task with the 2-rank reshard right after it
    assert [[t.name for t in b] for b in g.ready(("all", 2, ""), set())] == \
        [[train.name, f"{hsdp.key}.reshard"]]
    assert g.ready(("all", 4, ""), set()) == []  # waits for the checkpoint
    assert g.pending(dp4.key) == [train.name, f"{dp4.key}.reshard"]
    row = dict(check="fp32_parity", quantity="loss", metric="max_abs", value=0.0,
               tolerance=1e-6, outcome="pass", detail="")
    g.done[train.name] = TaskResult(train.name, "ok", rows=[row], seconds=2.0)
    assert [[t.name for t in b] for b in g.ready(("all", 4, ""), set())] == \
        [[f"{dp4.key}.reshard"]]
    g.done[f"{dp4.key}.reshard"] = TaskResult(f"{dp4.key}.reshard", "ok", seconds=1.0)
    res = assemble(dp4, g.tasks[dp4.key], g.done)
    [note] = [r for r in res.rows if r["quantity"] == SHARED]
    assert note["outcome"] == "info" and note["phase"] == "train" and none.id in note["detail"]
    assert dict(row, phase="train") in res.rows and res.seconds == 3.0
    own = assemble(none, g.tasks[none.key], g.done)
    assert not [r for r in own.rows if r["quantity"] == SHARED]


def test_a_shared_train_task_that_made_no_checkpoint_leaves_each_reshard_not_run(cases):
    none, dp4 = cases["none-none"], cases["to_dp4-none"]
    g = _graph([none, dp4])
    train = g.tasks[none.key][0]
    save = dict(check="save", quantity="*", metric="coverage", value=float("nan"),
                tolerance=float("nan"), outcome="failed", detail="failed: disk full")
    g.done[train.name] = TaskResult(train.name, "ok", rows=[save])
    assert g.ready(("all", 4, ""), set()) == []
    rows = g.done[f"{dp4.key}.reshard"].rows
    assert rows == not_run_reshard(dp4, g.done[train.name])
    assert all(r["outcome"] == "not_run" and "disk full" in r["detail"] for r in rows)


def test_a_train_phase_a_reshard_loads_saves_even_where_no_check_needs_the_checkpoint():
    parity = Check("fp32_parity", ("trained", "reference"), lambda a, r: None)
    assert "save" not in [p.name for p in producers_for("train", [parity])]
    assert "save" in [p.name for p in producers_for("train", [parity], for_reshard=True)]


@pytest.mark.integration
def test_a_run_trains_once_for_the_cases_that_share_a_train_phase(cases, tmp_path):
    """A real run (pytest, CPU launches): 4 cases, 2 trainings; the shared cases pass with the
    reshard loading the checkpoint and expected state the case without target saved, their
    history rows carry that training's rows and the note; the case with a fault trains itself
    and its reshard fails as the fault says."""
    import pandas as pd

    scen = tmp_path / SCENARIO.name
    scen.write_text(SCENARIO.read_text())
    rc, out = run_pytest(tmp_path, "--scenario", str(scen), "--report-dir",
                         str(tmp_path / "rep"), *FORK, timeout=300)
    assert rc == 1 and "3 passed, 1 failed" in out, out[-3000:]
    assert "2 resharding case(s) loaded the checkpoint the same case without target saved" \
        in out
    [run] = (tmp_path / "rep" / "runs").iterdir()
    trained = sorted(p.name for p in run.glob("launches/L*/results/*.train.json"))
    assert trained == sorted(f"{c.key}.train.json" for k, c in cases.items()
                             if k in ("none-none", "to_dp4-perturb_loaded"))
    df = pd.read_parquet(next((tmp_path / "rep" / "history").glob("*.parquet")))
    cols = ["phase", "check", "quantity", "metric", "value", "row_outcome"]
    none = cases["none-none"]

    def train_rows(case):
        d = df[(df["case_id"] == case.id) & (df["phase"] == "train")
               & (df["quantity"] != SHARED) & (df["quantity"] != "time")]
        return d[cols].fillna(-1).to_dict("records")
    for k in ("to_dp4-none", "to_hsdp2x1-none"):
        mine = df[df["case_id"] == cases[k].id]
        assert (mine.loc[mine["check"] == "case", "row_outcome"] == "passed").all()
        assert train_rows(cases[k]) == train_rows(none)
        [note] = mine.loc[mine["quantity"] == SHARED, "detail"]
        assert none.id in note
        cov = mine[(mine["metric"] == "coverage") & (mine["phase"] == "reshard")]
        assert set(cov["row_outcome"]) == {"passed"} and len(cov) >= 3
    faulted = df[df["case_id"] == cases["to_dp4-perturb_loaded"].id]
    assert not (faulted["quantity"] == SHARED).any()
    bad = faulted[(faulted["phase"] == "reshard") & (faulted["row_outcome"] == "fail")]
    assert ("reshard", "state") in set(zip(bad["check"], bad["quantity"]))
