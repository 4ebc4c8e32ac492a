"""The tasks of a run and what depends on what.

A case has a ``train`` task on its mesh's world size and, when it reshards, a ``reshard`` task
on the target's world size that loads the train task's checkpoint. Tasks are grouped by *key*
(scope, world size): the lanes of a key run its tasks. A task is *open* while it has no result
and no lane holds it; an open task is *ready* when it can run now.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from harness.launch.case_result import not_run_reshard, save_missing
from harness.launch.tasks import Task, TaskResult
from harness.spec.matrix import Case


class TaskGraph:
    def __init__(self, cases: list[Case], ckpt_root: Path, scope_of: Callable[[Case], str]):
        self.scope_of = scope_of
        self.tasks: dict[str, list[Task]] = {}  # case key -> [train, reshard?]
        for c in cases:
            ckpt = Path(ckpt_root) / c.key
            ts = [Task(f"{c.key}.train", c, "train", ckpt)]
            if c.target is not None:
                ts.append(Task(f"{c.key}.reshard", c, "reshard", ckpt))
            self.tasks[c.key] = ts
        self.done: dict[str, TaskResult] = {}

    def key(self, t: Task) -> tuple:
        return self.scope_of(t.case), t.world_size

    def keys(self) -> list[tuple]:
        """Every key, the larger worlds first."""
        keys = {self.key(t) for ts in self.tasks.values() for t in ts}
        return sorted(keys, key=lambda k: (k[0], -k[1]))

    def pending(self, case_key: str) -> list[str]:
        return [t.name for t in self.tasks.get(case_key, ()) if t.name not in self.done]

    def all_done(self) -> bool:
        return not any(self.pending(k) for k in self.tasks)

    def timeout_s(self, key: tuple) -> float:
        return max(t.case.timeout_s for ts in self.tasks.values() for t in ts
                   if self.key(t) == key)

    def train_ok(self, case: Case) -> bool:
        """The train task finished and saved the checkpoint the reshard task loads."""
        r = self.done.get(f"{case.key}.train")
        return r is not None and r.status == "ok" and not save_missing(r)

    def open(self, key: tuple, held: set[str]) -> list[Task]:
        """Tasks of ``key`` with no result that no lane holds (``held``): ready now or later."""
        return [t for ts in self.tasks.values() for t in ts
                if t.name not in self.done and t.name not in held and self.key(t) == key]

    def ready(self, key: tuple, held: set[str]) -> list[list[Task]]:
        """What ``key``'s lanes can take now, one list per case: a train task (with its reshard
        task when that runs on the same world size, right after it), or a reshard task whose
        train task saved its checkpoint. A reshard task whose train task made no checkpoint is
        resolved here, as not run with the reason."""
        open_ = self.open(key, held)
        names = {t.name for t in open_}
        out = []
        for t in open_:
            train = f"{t.case.key}.train"
            if t.phase == "train":
                out.append([t] + [r for r in self.tasks[t.case.key][1:] if r.name in names])
            elif train in names:
                continue  # goes with its train task
            elif self.train_ok(t.case):
                out.append([t])
            elif train in self.done:
                self.done[t.name] = TaskResult(t.name, "ok", rows=not_run_reshard(
                    t.case, self.done[train]))
        return out
