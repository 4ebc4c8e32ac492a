"""Hand case phases to long-lived launches and each case its result.

A case has a ``train`` task and maybe a ``reshard`` task (``harness/task_graph.py``: what
depends on what, and what is ready). The scheduler runs one
*lane* per (scope, world size, GPU slot): a launch that lives as long as tasks can still come
for it and pulls them as they become ready (``harness/launcher.py``) -- train tasks at once,
reshard tasks once their train task saved its checkpoint, or together with it when both run on
the same world size. A lane keeps at most ``DEPTH`` cases queued, so the slots of one world
size share its tasks as they free up; a lane takes cases of the modules it already ran first
(``Scheduler._affinity``: first use of a module costs seconds in each process on GPU). A run
thus pays one process start per world size and slot, however many cases and phases there are.

Results come back as each task finishes; a train task that made no checkpoint resolves its
reshard task at once (``not_run``, with the reason). ``concurrency`` bounds how many lanes are
*busy* (have queued or running tasks) at once -- on a small CPU box one, since launches would
only fight over the cores; an idle lane (waiting for a dependency) costs nothing and is fed
later without a new launch. Larger world sizes go first.

Scopes keep lanes apart: without pytest-xdist there is one scope; with it, each scope is an
xdist_group so a group's cases run on one xdist worker.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Callable

from .case_result import CaseResult, assemble
from .launcher import STOP_JOIN_S, Launcher, Task, TaskResult
from .matrix import Case
from .task_graph import TaskGraph

DEPTH = 2  # cases a lane keeps queued (one running, one ready to start at once)


class Scheduler:
    def __init__(self, launcher: Launcher, cases: list[Case], ckpt_root: Path,
                 scope_of: Callable[[Case], str] = lambda c: "all",
                 env_for: Callable[[int], dict] | None = None, concurrency: int | None = None):
        self.launcher = launcher
        self.graph = TaskGraph(cases, ckpt_root, scope_of)
        self.done = self.graph.done  # task name -> TaskResult
        self.on_launch: list[Callable] = []  # callbacks(record) for reporting
        launcher.on_record.append(lambda rec: [cb(rec) for cb in self.on_launch])
        self._cond = threading.Condition()
        self._lanes: dict[tuple, list[_Lane]] = {}  # (scope, world) -> running lanes
        self._error: BaseException | None = None
        # busy lanes at once; None: no limit. On a small CPU box overlapping launches only
        # fight over the cores, so the plugin passes 1 there.
        self.concurrency = concurrency

    # ------------------------------------------------------------------------------------
    def begin(self) -> None:
        """Start the lanes that have work now, as the first :meth:`result` would: the caller
        may then do other work before it waits for a result."""
        with self._cond:
            self._dispatch()

    def result(self, case: Case) -> CaseResult:
        try:
            with self._cond:
                while left := self.graph.pending(case.key):
                    if self._error is not None:
                        raise self._error
                    self._dispatch()
                    if not any(self._lanes.values()):
                        raise RuntimeError(f"no launch can run {left[0]}")  # by construction
                    self._cond.wait(timeout=1.0)
        except BaseException:  # Ctrl-C: stop every launch, keep what finished before it
            self._stop_all()
            raise
        return assemble(case, self.graph.tasks[case.key], self.done)

    def finished(self, case: Case) -> CaseResult | None:
        """The case's result if every task of it has one (without launching), else None: what
        an interrupted run can still record."""
        if case.key not in self.graph.tasks or self.graph.pending(case.key):
            return None
        return assemble(case, self.graph.tasks[case.key], self.done)

    # -- which lane may take what (all called with the condition held) -----------------------
    def _held(self) -> set[str]:
        return {n for lanes in self._lanes.values() for lane in lanes for n in lane.assigned}

    def _ready(self, key: tuple) -> list[list[Task]]:
        return self.graph.ready(key, self._held())

    def _may_run(self, lane: "_Lane | None", key: tuple) -> bool:
        """Within ``concurrency`` busy lanes; when that is bounded, the first key in order with
        ready work goes first."""
        if self.concurrency is None or (lane is not None and lane.assigned):
            return True
        busy = sum(1 for lanes in self._lanes.values() for ln in lanes if ln.assigned)
        if busy >= self.concurrency:
            return False
        return next((k for k in self.graph.keys() if self._ready(k)), None) == key

    def _take(self, lane: "_Lane") -> list[Task]:
        if not self._may_run(lane, lane.key):
            return []
        cases_queued = len({n.rsplit(".", 1)[0] for n in lane.assigned})
        ready, out = self._ready(lane.key), []
        for _ in range(max(0, DEPTH - cases_queued)):
            if not ready:
                break
            left = Counter(b[0].case.ax.get("module") for b in ready)
            batch = min(ready, key=lambda b: self._affinity(lane, b[0].case, left))  # first best
            ready.remove(batch)
            lane.modules.add(batch[0].case.ax.get("module"))
            out += batch
        lane.assigned.update(t.name for t in out)
        return out

    def _affinity(self, lane: "_Lane", case: Case, left: Counter) -> tuple:
        """Which case a lane takes next (the smallest): a module it ran (its launch paid that
        module's first-use costs: TE's compiled functions, kernel and library set-up -- seconds
        a module and process on GPU); else a module no lane of its key ran yet; else the module
        with the most ready cases (``left``) per lane that ran it. Lanes sharing a world size
        so specialize by module instead of each warming every module."""
        module = case.ax.get("module")
        if module in lane.modules:
            return (0, 0.0)
        warm = sum(module in ln.modules for ln in self._lanes.get(lane.key, ()) if ln is not lane)
        return (1, 0.0) if not warm else (2, -left[module] / warm)

    # -- lanes -------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        """Start lanes for keys with ready work, up to one per GPU slot. Condition held."""
        for key in self.graph.keys():
            slots = self.launcher.slots(key[1])
            lanes = self._lanes.setdefault(key, [])
            ready = len(self._ready(key))
            while len(lanes) < len(slots) and ready > sum(1 for ln in lanes if not ln.assigned):
                if not self._may_run(None, key):
                    break
                used = {ln.slot for ln in lanes}
                slot = next(i for i in range(len(slots)) if i not in used)
                lane = _Lane(self, key, slot, slots[slot])
                lanes.append(lane)
                lane.start()
                ready -= 1

    def _lane_done(self, lane: "_Lane", err: BaseException | None) -> None:
        with self._cond:
            self._lanes[lane.key].remove(lane)
            self.done.update(self.launcher.salvaged if err is not None else {})
            if err is not None and self._error is None:
                self._error = err
            self._cond.notify_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """End every lane (bounded): with every task done they close by themselves; otherwise
        (the run was cut short) their launches are stopped. Then the launcher's agent servers
        end: no process of the run outlives this."""
        with self._cond:
            pending = not self.graph.all_done()
        try:
            if pending:
                self._stop_all()
            else:
                self._join_lanes()
        finally:
            self.launcher.close()

    def _stop_all(self) -> None:
        self.launcher.stop()
        self._join_lanes()
        with self._cond:
            self.done.update(self.launcher.salvaged)

    def _join_lanes(self) -> None:
        with self._cond:
            self._cond.notify_all()
            threads = [ln.thread for lanes in self._lanes.values() for ln in lanes]
        for th in threads:
            th.join(timeout=STOP_JOIN_S)


class _Lane:
    """One (scope, world size, GPU slot): a thread running launch after launch
    (``Launcher.run_lane``) with this object as their task source."""

    def __init__(self, sched: Scheduler, key: tuple, slot: int, env: dict):
        self.s, self.key, self.slot, self.env = sched, key, slot, env
        self.assigned: set[str] = set()  # handed to the running launch, no result yet
        self.modules: set[str] = set()  # the modules of the cases it took (Scheduler._affinity)
        self.timeout_s = sched.graph.timeout_s(key)
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"lane-{key[0]}-w{key[1]}-s{slot}")

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        err = None
        try:
            self.s.launcher.run_lane(self, self.key[1], self.env)
        except BaseException as e:  # Interrupted / a launcher error: the waiting item raises it
            err = e
        self.s._lane_done(self, err)

    def _closed(self) -> bool:
        """Nothing more can come: every task of the key has a result or is in some lane."""
        return not self.s.graph.open(self.key, self.s._held())

    # the TaskSource protocol (called from this lane's thread)
    def first(self) -> list[Task] | None:
        with self.s._cond:
            while not self.s.launcher._stop.is_set():
                got = self.s._take(self)
                if got:
                    return got
                if self._closed():
                    return None
                self.s._cond.wait(timeout=1.0)
        return None

    def more(self, launch) -> list[Task] | None:
        with self.s._cond:
            got = self.s._take(self)
            if not got and self._closed():
                return None
            return got

    def finished(self, results: dict[str, TaskResult]) -> None:
        with self.s._cond:
            self.s.done.update(results)
            self.assigned.difference_update(results)
            self.s._cond.notify_all()

    def requeue(self, tasks: list[Task]) -> None:
        with self.s._cond:
            self.assigned.difference_update(t.name for t in tasks)
            self.s._cond.notify_all()
