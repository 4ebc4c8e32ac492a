"""The tasks of a run and what depends on what.

A case has a ``train`` task on its mesh's world size and, when it reshards, a ``reshard`` task
on the target's world size that loads the train task's checkpoint. A resharding case whose
train phase another case of the run has too (same ``Case.train_key``: the same case but for
the target, e.g. dp2-sync-to_dp4 and dp2-sync-none) shares that case's train task instead of
training the same model again: its result holds that task's rows, as its own train phase would
have made them, and a note names the case. Tasks are grouped by *key*
(scope, world size, process-group backend of the case's phases: ``pg_of``, launch/placement.py):
the lanes of a key run its tasks. With ``group_modes`` (the ``mode_group`` layer) the train
tasks of a key whose cases differ only in their DCP mode form a group: the first one's task
lists the others as ``members``, and they go to a lane together (worker/mode_group.py runs
them from one trained run). A task is *open* while it has no result and no lane holds it; an
open task is *ready* when it can run now.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from harness.launch.case_result import not_run_reshard, save_missing
from harness.launch.tasks import Task, TaskResult
from harness.spec import catalog
from harness.spec.matrix import Case


class TaskGraph:
    def __init__(self, cases: list[Case], ckpt_root: Path, scope_of: Callable[[Case], str],
                 pg_of: Callable[[Case], str] = lambda c: "", group_modes: bool = False):
        self._root, self._scope_of, self._pg_of = Path(ckpt_root), scope_of, pg_of
        self._group_modes = group_modes
        self._by_name: dict[str, Task] = {}
        self._group: dict[str, tuple] = {}  # case key -> (scope, backend of its phases)
        self.tasks: dict[str, list[Task]] = {}  # case key -> [train, reshard?]
        self.followers: dict[str, list[Task]] = {}  # train task name -> reshard tasks after it
        self.all: list[Task] = []
        self.done: dict[str, TaskResult] = {}
        self.add(cases)

    def add(self, cases: list[Case]) -> None:
        """Tasks for ``cases`` (new keys), also while the lanes run: the scheduler's next look
        feeds them to their key's lanes, starting lanes where the key's had ended."""
        # (scope, backend) of each case, once: the scheduler asks a task's key on every look
        # at its lanes, and a case's backend is a placement of each of its phases
        self._group.update((c.key, (self._scope_of(c), self._pg_of(c))) for c in cases)
        def own(c: Case) -> Task:
            return Task(f"{c.key}.train", c, "train", self._root / c.key)
        # the train tasks of the cases without target: the ones a resharding case may share
        # (on one process-group backend: on 2 GPUs a dp2 -> dp4 case is gloo throughout, the dp2
        # case without target NCCL, so each trains its own)
        # (within one call: a task of an earlier one may have run, its checkpoint not kept)
        cases = [c for c in cases if c.key not in self.tasks]
        trains = {(self._group[c.key], c.train_key): own(c) for c in cases if c.target is None}
        for c in cases:
            train = trains.get((self._group[c.key], c.train_key)) or own(c)
            self.tasks[c.key] = [train]
            if c.target is not None:
                train.for_reshard = True
                reshard = Task(f"{c.key}.reshard", c, "reshard", train.ckpt_dir)
                self.followers.setdefault(train.name, []).append(reshard)
                self.tasks[c.key].append(reshard)
        if self._group_modes:
            self._group_by_mode(list({t.name: t for c in cases
                                      for t in self.tasks[c.key][:1]}.values()))
        # every task once, in the cases' order (a shared train task is in several lists)
        self.all = list({t.name: t for ts in self.tasks.values() for t in ts}.values())
        self._by_name = {t.name: t for t in self.all}

    def _group_by_mode(self, trains: list[Task]) -> None:
        groups: dict[tuple, list[Task]] = {}
        for t in trains:
            k = mode_free_key(t.case)
            if k is not None:
                groups.setdefault((self._group[t.case.key], k), []).append(t)
        for ts in groups.values():
            if len(ts) > 1 and len({t.case.ax["dcp"] for t in ts}) == len(ts):
                ts[0].members = ts[1:]
                for m in ts[1:]:
                    m.leader = ts[0].name

    @property
    def shared_with(self) -> dict[str, Case]:
        """Case key -> the case whose train task it shares (its train phase is that case's)."""
        return {k: ts[0].case for k, ts in self.tasks.items() if ts[0].case.key != k}

    def key(self, t: Task) -> tuple:
        scope, pg = self._group[t.case.key]
        return scope, t.world_size, pg

    def keys(self) -> list[tuple]:
        """Every key, the larger worlds first."""
        keys = {self.key(t) for t in self.all}
        return sorted(keys, key=lambda k: (k[0], -k[1], k[2]))

    def pending(self, case_key: str) -> list[str]:
        return [t.name for t in self.tasks.get(case_key, ()) if t.name not in self.done]

    def all_done(self) -> bool:
        return not any(self.pending(k) for k in self.tasks)

    def batches(self, held: set[str]) -> int:
        """The batches among the tasks ``held`` (a lane's): train tasks, and reshard tasks whose
        train task is not held -- a train task and its reshard tasks are one (counted by cases,
        such a batch would fill a lane of two, which then idles until the short reshard is
        done)."""
        return sum(1 for n in held if not (self._by_name[n].leader in held) and (
            not n.endswith(".reshard") or self.tasks[n.rsplit(".", 1)[0]][0].name not in held))

    def measured_s(self) -> dict[str, float]:
        """Seconds each task that ran to its end took (its first rank's): what the next run
        weighs its tasks by (speed/task_seconds.py)."""
        return {n: r.seconds for n, r in self.done.items() if r.status == "ok" and r.seconds > 0}

    def timeout_s(self, key: tuple) -> float:
        return max(t.case.timeout_s for t in self.all if self.key(t) == key)

    def train_ok(self, train: Task) -> bool:
        """The train task finished and saved the checkpoint its reshard tasks load."""
        r = self.done.get(train.name)
        return r is not None and r.status == "ok" and not save_missing(r)

    def open(self, key: tuple, held: set[str]) -> list[Task]:
        """Tasks of ``key`` with no result that no lane holds (``held``): ready now or later."""
        return [t for t in self.all
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
            if t.phase == "train":
                if t.leader in names:
                    continue  # goes with its group's first task
                out.append([x for m in [t] + [m for m in t.members if m.name in names]
                            for x in [m] + [r for r in self.followers.get(m.name, ())
                                            if r.name in names]])
                continue
            train = self.tasks[t.case.key][0]
            if train.name in names:
                continue  # goes with its train task
            if self.train_ok(train):
                out.append([t])
            elif train.name in self.done:
                self.done[t.name] = TaskResult(t.name, "ok", rows=not_run_reshard(
                    t.case, self.done[train.name]))
        return out


def mode_free_key(case: Case) -> str | None:
    """What determines a case's train phase but its DCP mode (``Case.train_key`` without the
    ``dcp`` axis, the checks and the workarounds, which each mode runs its own way); None for
    a case that injects a fault (its train phase is its own; ``restore_drift`` tests the
    group)."""
    if "dcp" not in case.ax or case.ax.get("fault", "none") not in catalog.MODE_GROUP_FAULTS:
        return None
    d = json.loads(case.train_key)
    d["axes"] = [a for a in d["axes"] if a[0] != "dcp"]
    d.pop("checks", None)
    d.pop("workarounds", None)
    return json.dumps(d, sort_keys=True)
