"""Group case phases into torchrun launches and hand each case its result.

A case has a ``train`` task on its mesh's world size and, when it reshards, a ``reshard``
task on the target's world size that needs the train task's checkpoint. When a case's result
is asked for, the scheduler runs launches until it is known; each launch takes *every* ready
task of one world size in the same scope (train tasks are always ready, reshard tasks once
their train task ran). Two world sizes thus need three or four launches for any number of
cases.

Scopes keep launches apart: without pytest-xdist there is one scope; with it, each scope is an
xdist_group so a group's cases run on one xdist worker.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .checks.record import FAILED
from .launcher import Launcher, Task, TaskResult
from .matrix import Case


@dataclass
class CaseResult:
    case: Case
    status: str  # "ok" | "error" | "timeout" | "crash" (the worst of its tasks)
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


_SEVERITY = {"ok": 0, "error": 1, "crash": 2, "timeout": 3}


class Scheduler:
    def __init__(self, launcher: Launcher, cases: list[Case], ckpt_root: Path,
                 scope_of: Callable[[Case], str] = lambda c: "all",
                 env_for: Callable[[int], dict] | None = None):
        self.launcher = launcher
        self.ckpt_root = Path(ckpt_root)
        self.scope_of = scope_of
        self.tasks: dict[str, list[Task]] = {}
        for c in cases:
            ckpt = self.ckpt_root / c.key
            ts = [Task(f"{c.key}.train", c, "train", ckpt)]
            if c.target is not None:
                ts.append(Task(f"{c.key}.reshard", c, "reshard", ckpt))
            self.tasks[c.key] = ts
        self.done: dict[str, TaskResult] = {}
        self.on_launch: list[Callable] = []  # callbacks(record) for reporting
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------
    def result(self, case: Case) -> CaseResult:
        with self._lock:
            while True:
                pending = [t for t in self.tasks[case.key] if t.name not in self.done]
                if not pending:
                    break
                nxt = pending[0]
                if nxt.phase == "reshard" and not self._train_ok(case):
                    self.done[nxt.name] = TaskResult(
                        nxt.name, "error", errors={-1: "not run: the train phase failed"})
                    continue
                self._launch_world(nxt.world_size, self.scope_of(case))
        return self._assemble(case)

    def _train_ok(self, case: Case) -> bool:
        r = self.done.get(f"{case.key}.train")
        return r is not None and r.status == "ok"

    def _ready(self, scope: str, world: int) -> list[Task]:
        """Tasks of ``world`` in ``scope`` that can run now: train tasks, then reshard tasks
        whose train task succeeded or runs earlier in this same launch (same world size)."""
        trains, reshards, in_launch = [], [], set()
        for ts in self.tasks.values():
            for t in ts:
                if t.name in self.done or self.scope_of(t.case) != scope or t.world_size != world:
                    continue
                if t.phase == "train":
                    trains.append(t)
                    in_launch.add(t.case.key)
                elif self._train_ok(t.case) or t.case.key in in_launch:
                    reshards.append(t)
        return trains + reshards

    def _launch_world(self, world: int, scope: str) -> None:
        tasks = self._ready(scope, world)
        n_before = len(self.launcher.records)
        results = self.launcher.run_batch(tasks, world)
        self.done.update(results)
        for rec in self.launcher.records[n_before:]:
            for cb in self.on_launch:
                cb(rec)

    def _assemble(self, case: Case) -> CaseResult:
        res = CaseResult(case=case, status="ok")
        for t in self.tasks[case.key]:
            r = self.done[t.name]
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
