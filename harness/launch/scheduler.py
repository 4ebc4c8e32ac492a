"""Hand case phases to long-lived launches and each case its result.

A case has a ``train`` task and maybe a ``reshard`` task (``task_graph.py``). One *lane* per
(scope, world size, process-group backend, GPU slot) runs a launch that lives while tasks can
come, fed through its :class:`~harness.launch.feed.Feed`: train tasks at once, reshard tasks
once their train task saved its checkpoint (with it, on the same world size). A lane keeps
``DEPTH`` batches queued (``TaskGraph.batches``) and takes cases of the modules and recipes it
already ran first; a lane with nothing of its own left takes over the module with the most
seconds left per lane running it (``lane_choice.affinity``: a module's first use under a recipe
costs seconds per process on GPU; ``seconds``: what the tasks took in the last run, where
known). ``concurrency`` bounds the *busy* lanes (one on a small CPU box); an idle lane waits
for a dependency at no cost. Larger worlds go first. ``after`` sees each batch of results
(the plugin cancels what a timeout makes pointless). Its state is the thread's that calls
:meth:`Scheduler.result` (pytest's main one): it feeds the lanes and reads what they post on
its event queue; a lane never calls into it. Scopes (xdist groups) keep lanes apart.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Callable

from harness.launch.case_result import CaseResult, assemble
from harness.launch.feed import Feed
from harness.launch.launcher import STOP_JOIN_S, Launcher, Task
from harness.launch.placement import case_backend
from harness.launch.task_graph import TaskGraph
from harness.spec.matrix import Case
from harness.speed.lane_choice import TaskSeconds, kind, pick

__all__ = ["CaseResult", "Scheduler"]

DEPTH = 2  # batches a lane keeps queued (one running, one ready to start at once)
WAIT_S = 1.0  # the longest the scheduler sleeps between looks at its lanes


class Scheduler:
    def __init__(self, launcher: Launcher, cases: list[Case], ckpt_root: Path,
                 scope_of: Callable[[Case], str] = lambda c: "all",
                 concurrency: int | None = None, seconds: dict[str, float] | None = None,
                 after: Callable[["Scheduler", dict], None] | None = None):
        self.launcher, self.affinity = launcher, "lane_affinity" in launcher.speed
        self.after = after or (lambda s, done: None)  # sees each batch of results
        self.graph = TaskGraph(cases, ckpt_root, scope_of, lambda c: case_backend(c, launcher),
                               group_modes="mode_group" in launcher.speed)
        self.seconds = TaskSeconds(seconds)  # what a lane taking over a module weighs
        self.done = self.graph.done  # task name -> TaskResult
        self.events: queue.Queue = queue.Queue()  # what the lanes post (Feed)
        self._lanes: dict[tuple, list[_Lane]] = {}  # (scope, world, pg) -> running lanes
        self._error: BaseException | None = None
        # busy lanes at once (None: no limit; 1 on a small CPU box, where they fight for cores)
        self.concurrency = concurrency

    # ------------------------------------------------------------------------------------
    def begin(self) -> None:
        """Start the lanes that have work now, as the first :meth:`result` would: the caller
        may then do other work before it waits for a result."""
        self._dispatch()

    def result(self, case: Case) -> CaseResult:
        try:
            while left := self.graph.pending(case.key):
                if self._error is not None:
                    raise self._error
                self._dispatch()
                if not any(self._lanes.values()):
                    raise RuntimeError(f"no launch can run {left[0]}")  # by construction
                self._handle(WAIT_S)
        except BaseException:  # Ctrl-C: stop every launch, keep what finished before it
            self._stop_all()
            raise
        return assemble(case, self.graph.tasks[case.key], self.done)

    def finished(self, case: Case) -> CaseResult | None:
        """The case's result where every task of it has one (no launch), else None."""
        if case.key not in self.graph.tasks or self.graph.pending(case.key):
            return None
        return assemble(case, self.graph.tasks[case.key], self.done)

    # -- what the lanes posted ---------------------------------------------------------------
    def _handle(self, timeout_s: float | None) -> None:
        """Apply the lanes' events: the first waited for up to ``timeout_s`` (or none)."""
        try:
            event = self.events.get(timeout=timeout_s) if timeout_s else self.events.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, lane, payload = event
            if kind == "finished":
                self.done.update(payload)
                lane.assigned.difference_update(payload)
                self.after(self, payload)
            elif kind == "requeue":
                lane.assigned.difference_update(t.name for t in payload)
            else:  # "end": the lane's thread is done
                self._lanes[lane.key].remove(lane)
                if payload is not None and self._error is None:
                    self._error = payload
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return

    # -- which lane may take what ------------------------------------------------------------
    def held(self) -> set[str]:  # the tasks lanes hold (no result yet)
        return {n for lanes in self._lanes.values() for lane in lanes for n in lane.assigned}

    def _ready(self, key: tuple) -> list[list[Task]]:
        return self.graph.ready(key, self.held())

    def _may_run(self, lane: "_Lane | None", key: tuple) -> bool:
        """Within ``concurrency`` busy lanes; if bounded, the first key with ready work first."""
        if self.concurrency is None or (lane is not None and lane.assigned):
            return True
        busy = sum(1 for lanes in self._lanes.values() for ln in lanes if ln.assigned)
        if busy >= self.concurrency:
            return False
        return next((k for k in self.graph.keys() if self._ready(k)), None) == key

    def _take(self, lane: "_Lane") -> list[Task]:
        if lane.closed or not self._may_run(lane, lane.key):
            return []
        ready, out = self._ready(lane.key), []
        for _ in range(max(0, DEPTH - self.graph.batches(lane.assigned))):
            if not ready:
                break
            left = self.seconds.left(ready)
            others = [ln.ran for ln in self._lanes.get(lane.key, ()) if ln is not lane]
            batch = pick(ready, lane.ran, left, others, self.affinity)
            ready.remove(batch)  # the first best
            lane.ran.add(kind(batch[0].case))
            out += batch
        lane.assigned.update(t.name for t in out)
        return out

    # -- lanes -------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        """Feed the open lanes, start lanes for ready work up to one per GPU slot, and close
        the feeds of lanes that can get nothing more."""
        for key in self.graph.keys():
            lanes = self._lanes.setdefault(key, [])
            for lane in lanes:
                got = self._take(lane)
                if got:
                    lane.feed.put(got)
            slots = self.launcher.slots(key[1], key[2])
            while len(lanes) < len(slots) and self._ready(key) and self._may_run(None, key):
                used = {ln.slot for ln in lanes}
                slot = next(i for i in range(len(slots)) if i not in used)
                lane = _Lane(self, key, slot, slots[slot])
                got = self._take(lane)
                if not got:
                    break
                lane.feed.put(got)
                lanes.append(lane)
                lane.start()
            if not self.graph.open(key, self.held()):  # every task has a result or a lane
                for lane in lanes:
                    lane.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """End every lane (bounded): with every task done their feeds close and they end by
        themselves; otherwise (the run was cut short) their launches are stopped. No process of
        the run outlives this."""
        if self.graph.all_done():
            self._join_lanes()
        else:
            self._stop_all()

    def _stop_all(self) -> None:
        self.launcher.stop()
        self._join_lanes()

    def _join_lanes(self) -> None:
        lanes = [ln for lanes in self._lanes.values() for ln in lanes]
        for lane in lanes:
            lane.close()
        for lane in lanes:
            lane.thread.join(timeout=STOP_JOIN_S)
        self._handle(None)  # what the lanes posted last (results of launches cut short)


class _Lane:
    """One (scope, world size, process-group backend, GPU slot): a thread running launch after
    launch (``Launcher.run_lane``) on its feed."""

    def __init__(self, sched: Scheduler, key: tuple, slot: int, env: dict):
        self.key, self.slot, self.env = key, slot, env
        self.launcher = sched.launcher
        self.feed = Feed(self, sched.events, sched.graph.timeout_s(key))
        self.assigned: set[str] = set()  # handed to the lane, no result yet
        self.ran: set[tuple] = set()  # (module, recipe) of the cases it took (affinity)
        self.closed = False
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"lane-{key[0]}-w{key[1]}{key[2]}-s{slot}")

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.feed.close()

    def _run(self) -> None:
        err = None
        try:
            self.launcher.run_lane(self.feed, self.key[1], self.env)
        except BaseException as e:  # Interrupted / a launcher error: the waiting item raises it
            err = e
        self.feed.ended(err)
