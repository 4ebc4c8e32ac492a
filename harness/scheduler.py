"""Group case phases into torchrun launches and hand each case its result.

A case has a ``train`` task on its mesh's world size and, when it reshards, a ``reshard``
task on the target's world size that needs the train task's checkpoint. When a case's result
is asked for, the scheduler starts a launch for every world size that has ready tasks and no
launch running -- in background threads, so launches of different world sizes run at once --
and waits until the case's tasks have results. Each launch takes *every* ready task of its
world size in the same scope (train tasks are always ready, reshard tasks once their train
task ran, or when it runs earlier in the same launch). Two world sizes thus need three or four
launches for any number of cases, and their start-up overlaps.

Scopes keep launches apart: without pytest-xdist there is one scope; with it, each scope is an
xdist_group so a group's cases run on one xdist worker.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import catalog
from .checks.record import COVERAGE, FAILED
from .launcher import STOP_JOIN_S, Launcher, Task, TaskResult
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


def _save_missing(r: TaskResult) -> str:
    """Why the train task made no checkpoint ('' if it made one), from its coverage rows."""
    for row in r.rows:
        if row["check"] == "save" and row.get("metric") == COVERAGE and row["outcome"] != "passed":
            return f"save {row['outcome']}: {row.get('detail', '')}"
    return ""


def _not_run_reshard(case: Case, train: TaskResult | None) -> list[dict]:
    """Coverage rows of the reshard phase's units when its train phase did not finish or made
    no checkpoint."""
    if train is not None and train.status == "ok":
        why = f"not run: needs the train phase's checkpoint, which was not made " \
              f"({_save_missing(train)[:300]})"
    else:
        why = f"not run: the train phase ended with {train.status if train else 'no result'}"
    units = ["expected", "reshard_load"] + [c for c in catalog.RESHARD_PHASE_CHECKS
                                            if c in case.checks]
    return [dict(check=u, quantity="*", metric=COVERAGE, value=math.nan, tolerance=math.nan,
                 outcome="not_run", detail=why) for u in units]


class Scheduler:
    def __init__(self, launcher: Launcher, cases: list[Case], ckpt_root: Path,
                 scope_of: Callable[[Case], str] = lambda c: "all",
                 env_for: Callable[[int], dict] | None = None, concurrency: int | None = None):
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
        launcher.on_record.append(lambda rec: [cb(rec) for cb in self.on_launch])
        self._cond = threading.Condition()
        self._assigned: set[str] = set()  # tasks handed to a running launch
        self._running: dict[tuple, threading.Thread] = {}  # (scope, world) -> launch thread
        self._error: BaseException | None = None
        # launches (of different world sizes) at once; None: no limit. On a small CPU box
        # overlapping launches only fight over the cores, so the plugin passes 1 there.
        self.concurrency = concurrency

    # ------------------------------------------------------------------------------------
    def result(self, case: Case) -> CaseResult:
        try:
            with self._cond:
                while True:
                    pending = [t for t in self.tasks[case.key] if t.name not in self.done]
                    if not pending:
                        break
                    nxt = pending[0]
                    if nxt.phase == "reshard" and f"{case.key}.train" in self.done \
                            and not self._train_ok(case):
                        self.done[nxt.name] = TaskResult(nxt.name, "ok", rows=_not_run_reshard(
                            case, self.done.get(f"{case.key}.train")))
                        continue
                    if self._error is not None:
                        raise self._error
                    self._dispatch()
                    if not self._running:
                        raise RuntimeError(f"no launch can run {nxt.name}")  # by construction
                    self._cond.wait(timeout=1.0)
        except BaseException:  # Ctrl-C: stop every launch, keep what finished before it
            self._stop_all()
            raise
        return self._assemble(case)

    def finished(self, case: Case) -> CaseResult | None:
        """The case's result if every task of it has one (without launching), else None: what
        an interrupted run can still record."""
        if any(t.name not in self.done for t in self.tasks.get(case.key, ())):
            return None
        return self._assemble(case)

    def _train_ok(self, case: Case) -> bool:
        """The train task finished and saved the checkpoint the reshard task loads."""
        r = self.done.get(f"{case.key}.train")
        return r is not None and r.status == "ok" and not _save_missing(r)

    def _ready(self, scope: str, world: int) -> list[Task]:
        """Tasks of ``world`` in ``scope`` that can run now: train tasks, then reshard tasks
        whose train task succeeded or runs earlier in this same launch (same world size)."""
        trains, reshards, in_launch = [], [], set()
        for ts in self.tasks.values():
            for t in ts:
                if t.name in self.done or t.name in self._assigned \
                        or self.scope_of(t.case) != scope or t.world_size != world:
                    continue
                if t.phase == "train":
                    trains.append(t)
                    in_launch.add(t.case.key)
                elif self._train_ok(t.case) or t.case.key in in_launch:
                    reshards.append(t)
        return trains + reshards

    def _dispatch(self) -> None:
        """Start a launch thread for each (scope, world size) with ready tasks and none running.
        Called with the condition held."""
        keys = {(self.scope_of(t.case), t.world_size) for ts in self.tasks.values() for t in ts
                if t.name not in self.done and t.name not in self._assigned}
        for key in sorted(keys, key=lambda k: (k[0], -k[1])):  # the larger worlds first
            if key in self._running:
                continue
            if self.concurrency is not None and len(self._running) >= self.concurrency:
                return
            tasks = self._ready(*key)
            if not tasks:
                continue
            self._assigned.update(t.name for t in tasks)
            th = threading.Thread(target=self._launch_world, args=(key, tasks), daemon=True,
                                  name=f"launch-{key[0]}-w{key[1]}")
            self._running[key] = th
            th.start()

    def _launch_world(self, key: tuple, tasks: list[Task]) -> None:
        results, err = {}, None
        try:
            results = self.launcher.run_batch(tasks, key[1])
        except BaseException as e:  # Interrupted / a launcher error: the waiting item raises it
            err = e
        with self._cond:
            self.done.update(self.launcher.salvaged if err is not None else results)
            self._assigned.difference_update(t.name for t in tasks)
            del self._running[key]
            if err is not None and self._error is None:
                self._error = err
            self._cond.notify_all()

    def _stop_all(self) -> None:
        self.launcher.stop()
        for th in list(self._running.values()):
            th.join(timeout=STOP_JOIN_S)
        with self._cond:
            self.done.update(self.launcher.salvaged)

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
