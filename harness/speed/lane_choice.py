"""Which lane takes which case, and how many lanes a world size gets beyond one per module:
the scheduler's and the launcher's policy, as plain functions of the cases, the tasks' expected
seconds and what each lane ran (no processes here).

A rank process pays a module's first use under a recipe once -- TE's compiled functions,
run-time compiled kernels, cuDNN's graphs: seconds a module, and again for a further recipe --
so a lane keeps to the (module, recipe) pairs it ran (``affinity``).
Where the last run's task seconds are known (pytest's cache: speed/task_seconds.py), a lane
out of work takes over the module with the most seconds left per lane running it, and a module
k times the mean module's gets round(k) - 1 lanes more (``extra_lanes``) where every rank of the
run's lanes still gets a core of the host.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

from harness.spec.matrix import Case


def kind(case: Case) -> tuple:
    """What a process pays first use for: a module under a recipe."""
    return case.ax.get("module"), case.ax.get("recipe")


def affinity(ran: set, case: Case, left: Counter, others: list[set]) -> tuple:
    """The key of ``case`` for a lane that ran the (module, recipe) pairs ``ran`` while the
    other lanes of its key ran ``others`` (the smallest is taken). First a module it ran; there
    async_process saves last (their stagers start with the launch and take seconds under load:
    a save taken early would wait for them), and a recipe it ran before one no other lane
    ran before one another lane runs. Else a module no lane of its key ran yet. Else it takes
    over the module with the most work left (``left``: expected seconds of its ready tasks) per
    lane that runs it -- a recipe no lane ran first (two lanes of one module split its recipes)."""
    module, last = case.ax.get("module"), case.ax.get("dcp") == "async_process"
    k = kind(case)
    taken = any(k in o for o in others)
    if any(m == module for m, _ in ran):
        return (0, last, 0 if k in ran else 1 + taken, 0.0)
    warm = sum(any(m == module for m, _ in o) for o in others)
    return (1, last, 0, 0.0) if not warm else (2, -left[module] / warm, taken, last)


def pick(ready: list, ran: set, left: Counter, others: list[set], on: bool = True) -> list:
    """The batch a lane that ran ``ran`` takes next of the ``ready`` ones: the best by
    :func:`affinity` (the first of equals), or without the layer ``lane_affinity`` the first
    ready one (the plain path)."""
    if not on:
        return ready[0]
    return min(ready, key=lambda b: affinity(ran, b[0].case, left, others))


class TaskSeconds:
    """A task's expected seconds: the last run's where known, else the mean of those known
    (1.0 where none is: the scheduler then weighs the number of tasks)."""

    def __init__(self, seconds: dict[str, float] | None):
        self.seconds = {k: v for k, v in (seconds or {}).items() if v > 0}
        self.default = (sum(self.seconds.values()) / len(self.seconds)) if self.seconds else 1.0

    def expected(self, task_name: str) -> float:
        return self.seconds.get(task_name, self.default)

    def left(self, ready: list[list]) -> Counter:
        """Module -> expected seconds of the ready batches (lists of tasks)."""
        out: Counter = Counter()
        for batch in ready:
            out[batch[0].case.ax.get("module")] += sum(self.expected(t.name) for t in batch)
        return out


def _extra(seconds_by_module: dict[str, float]) -> int:
    """Lanes beyond one per module for a world size whose modules' tasks took these seconds:
    a module k times the mean module's gets round(k) - 1 more. Else the slowest module's lane
    (TransformerLayer in the TE matrix) runs to the end alone, while a lane done first that takes
    over its cases pays the module's first use again. 0 where any module has no time (a first
    run, new cases)."""
    values = list(seconds_by_module.values())
    if len(values) < 2 or min(values) <= 0:
        return 0
    mean = sum(values) / len(values)
    return sum(max(0, round(v / mean) - 1) for v in values)


def extra_lanes(tasks: list, seconds: dict[str, float], lanes_of: Callable[[int], int],
                cores: int) -> dict[int, int]:
    """World size -> lanes beyond one per module (``_extra`` of the seconds of its modules'
    ``tasks``), none where the run's lanes (``lanes_of(world)`` each, plus these) would put more
    ranks on the host than it has ``cores``: then the ranks compete for the cores (the whole TE
    matrix's 42 ranks on 16 cores are CPU-bound) and a lane more only adds its first use."""
    by_world: dict[int, Counter] = {}
    for t in tasks:
        by_world.setdefault(t.world_size, Counter())[t.case.ax.get("module")] += \
            seconds.get(t.name, 0.0)
    extra = {w: _extra(dict(m)) for w, m in by_world.items()}
    if sum((lanes_of(w) + extra[w]) * w for w in by_world) > cores:
        return {}
    return {w: n for w, n in extra.items() if n}
