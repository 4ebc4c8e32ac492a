"""Launches started before their lane has tasks, so that their process start, imports and
process-group set-up overlap other work instead of adding to the wall time.

pytest spends seconds importing torch (and TE) and collecting before the first case runs, and on
a small CPU box the lanes of different world sizes run one after another, each starting its
launch only when the one before it ended. An *early* launch is started from the scenarios'
cases as soon as they are known (``pytest_configure``, before collection) for each world size
and GPU slot a lane will need; its ranks set up and wait on their task feed (harness/worker/
task_feed.py). The first lane of that world size, slot and largest case timeout takes it over
(``Launch.adopt``: its first tasks go through the feed) instead of starting a launch. Which
cases the run finally selects (``-k``, ``-m``, skips) is known only after collection: an early
launch no lane can take is ended then (``discard``) and recorded as ``early: unused``.
"""

from __future__ import annotations

import threading
from typing import Callable

from .launch import Launch
from .task_graph import TaskGraph


class EarlyLaunches:
    """The launcher's early launches that no lane took yet."""

    def __init__(self, launcher):
        self.l = launcher
        self._lock = threading.Lock()
        self.waiting: list[Launch] = []

    def start(self, world_size: int, env: dict, timeout_s: float) -> None:
        """Start a launch of ``world_size`` on slot ``env`` that waits for its tasks; the
        plan's timeouts follow from ``timeout_s``, the largest case timeout it may see."""
        launch = Launch(self.l, [], world_size, env, timeout_s=timeout_s, early=True)
        with self._lock:
            self.waiting.append(launch)
        launch.start()

    def take(self, world_size: int, env: dict, timeout_s: float) -> Launch | None:
        """A waiting launch for this world size, slot and largest case timeout (a lane whose
        cases have another timeout would get other collective timeouts: it starts its own)."""
        with self._lock:
            for launch in self.waiting:
                if (launch.world_size, launch.env, launch.timeout_s) == (world_size, env,
                                                                         timeout_s):
                    self.waiting.remove(launch)
                    return launch
        return None

    def keep_only(self, wanted_: list[tuple[int, dict, float]]) -> None:
        """End the waiting launches beyond what ``wanted_`` (see :func:`wanted`) still asks
        for: the cases the run selected in the end need no launch of their world size, slot
        or timeout."""
        left = list(wanted_)
        with self._lock:
            keep, drop = [], []
            for launch in self.waiting:
                want = (launch.world_size, launch.env, launch.timeout_s)
                (keep if want in left else drop).append(launch)
                if want in left:
                    left.remove(want)
            self.waiting = keep
        for launch in drop:
            launch.discard()

    def discard(self) -> None:
        """End (bounded) and record every waiting launch."""
        self.keep_only([])


def wanted(graph: TaskGraph, slots: Callable[[int], list[dict]]) -> list[tuple[int, dict, float]]:
    """(world size, slot env, largest case timeout) of each launch the scheduler's lanes will
    start first: per key of ``graph``, one per GPU slot up to one per case with a task there."""
    out = []
    for key in graph.keys():
        cases = {t.case.key for t in graph.open(key, set())}
        for env in slots(key[1])[:len(cases)]:
            out.append((key[1], env, graph.timeout_s(key)))
    return out


def allowed(config, worker_id: str | None) -> bool:
    """Early launches unless switched off, only collecting, under xdist (its workers' scopes
    are known only once it distributes the cases) or over several nodes."""
    opt = config.getoption
    return not (opt("no_early_launches") or opt("collectonly") or worker_id is not None
                or opt("dist", "no") != "no" or opt("nnodes") > 1)


def fitting(case_lists, world_size: int | None, max_world: int) -> list:
    """The cases that can run here by their world sizes (``--world-size``, the GPUs / ranks)."""
    return [c for cases in case_lists for c in cases
            if max(c.world_sizes) <= max_world
            and (not world_size or max(c.world_sizes) == world_size)]
