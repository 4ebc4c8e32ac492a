"""A host's per-core speed, which the bench records beside its figure: the same code runs each
process markedly slower on some GPU host kinds than on others (docs/performance.md), so a figure
names its host's speed, and two figures from hosts of unlike speed are not read as two versions
of the code."""

from __future__ import annotations

import statistics
import time

LOOP_STEPS = 3_000_000


def median_s(fn, repeats: int = 3) -> float:
    """The median seconds of ``repeats`` calls of ``fn``."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def python_loop_s(repeats: int = 3, steps: int = LOOP_STEPS) -> float:
    """The median seconds of a pure-Python loop of ``steps`` steps on one core (``repeats``
    runs): the part of a rank's time that follows the host's cores most."""
    return round(median_s(lambda: sum(i * i for i in range(steps)), repeats), 4)
