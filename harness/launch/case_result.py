"""What a case's tasks add up to: its :class:`CaseResult` (status, rows, errors, logs), and
the rows of a reshard phase that could not run because its train phase made no checkpoint."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.checks.outcomes import COVERAGE, FAILED
from harness.launch.tasks import Task, TaskResult
from harness.spec import catalog
from harness.spec.matrix import Case


@dataclass
class CaseResult:
    case: Case
    status: str  # "ok" | "error" | "timeout" | "crash" | "cancelled" (the worst of its tasks)
    rows: list[dict] = field(default_factory=list)  # each with "phase"
    errors: list[str] = field(default_factory=list)
    stacks: str = ""
    logs: dict = field(default_factory=dict)  # "phase rank R" -> log text
    seconds: float = 0.0
    launches: list[str] = field(default_factory=list)

    @property
    def failed_rows(self) -> list[dict]:
        return [r for r in self.rows if r["outcome"] in FAILED]

    @property
    def passed(self) -> bool:
        return self.status == "ok" and not self.failed_rows


_SEVERITY = {"ok": 0, "error": 1, "crash": 2, "timeout": 3, "cancelled": 3}


def save_missing(r: TaskResult) -> str:
    """Why the train task made no checkpoint ('' if it made one), from its coverage rows."""
    for row in r.rows:
        if row["check"] == "save" and row.get("metric") == COVERAGE and row["outcome"] != "passed":
            return f"save {row['outcome']}: {row.get('detail', '')}"
    return ""


def not_run_reshard(case: Case, train: TaskResult | None) -> list[dict]:
    """Coverage rows of the reshard phase's units when its train phase did not finish or made
    no checkpoint."""
    if train is not None and train.status == "ok":
        why = f"not run: needs the train phase's checkpoint, which was not made " \
              f"({save_missing(train)[:300]})"
    else:
        why = f"not run: the train phase ended with {train.status if train else 'no result'}"
    units = ["expected", "reshard_load"] + [c for c in catalog.RESHARD_PHASE_CHECKS
                                            if c in case.checks]
    return [dict(check=u, quantity="*", metric=COVERAGE, value=math.nan, tolerance=math.nan,
                 outcome="not_run", detail=why) for u in units]


def shared_note(train: Task) -> dict:
    """The note a case gets whose train phase is another case's train task."""
    return dict(check="train", quantity=catalog.SHARED_TRAIN_PHASE, metric="note", value=math.nan,
                tolerance=math.nan, outcome="info", phase="train",
                detail=f"the train phase (training, save, load and the checks of the trained "
                       f"model) is that of {train.case.id}: the same case but for the reshard "
                       f"target, trained once for both")


def assemble(case: Case, tasks: list[Task], done: dict) -> CaseResult:
    """A case's result from its tasks' results: the worst status, every row (with its phase),
    errors, stacks and logs."""
    res = CaseResult(case=case, status="ok")
    for t in tasks:
        r = done[t.name]
        if t.case.key != case.key:
            res.rows.append(shared_note(t))
        if _SEVERITY.get(r.status, 1) > _SEVERITY[res.status]:
            res.status = r.status
        res.rows += [dict(row, phase=t.phase) for row in r.rows]
        for rank, err in sorted(r.errors.items()):
            who = "launcher" if rank == -1 else f"rank {rank}"
            res.errors.append(f"[{t.phase}, {who}]\n{err}")
        if r.stacks:
            res.stacks += f"[{t.phase}]\n{r.stacks}\n"
        for rank, text in r.logs.items():
            res.logs[f"{t.phase} rank {rank}"] = text
        res.seconds += r.seconds
        if r.launch:
            res.launches.append(r.launch)
    return res
