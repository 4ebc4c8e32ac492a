"""CUDA contexts made in the order the run needs them (the ``context_order`` layer).

Rank processes that make their CUDA contexts at once share the driver's time and all finish
late together (docs/performance.md, "CUDA contexts in the run's order"). The run's largest
worlds bound its wall, so their ranks go first. A launch the launcher orders
(``launch/context_order.py``) tells its ranks, in :data:`VAR`, the run's gate directory and its
*tier* (0: the largest world). Each launch of the run's start registered there how many ranks
it has; a rank waits, before its context, until every rank of the registered launches of lower
tiers has made its own (a file each), at most :data:`WAIT_S` -- a rank that dies or hangs
before its context cannot hold the others longer. Nothing else changes: the same ranks make
the same contexts and run the same tasks.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

VAR = "HARNESS_CONTEXT_GATE"  # "<gate directory>|<tier>|<launch name>"
WAIT_S = 12.0  # the longest a rank waits for the ranks before it
POLL_S = 0.02


def parse(value: str | None) -> tuple[Path, int, str] | None:
    """(directory, tier, launch) of :data:`VAR`'s value, or None (no gate)."""
    if not value:
        return None
    d, tier, launch = value.split("|")
    return Path(d), int(tier), launch


def register(d: Path, tier: int, launch: str, ranks: int) -> None:
    """The launcher, before a launch's agents start: the launch and its rank count."""
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{launch}.tmp"
    tmp.write_text(str(ranks))
    tmp.replace(d / f"launch.{tier}.{launch}")


def waiting_for(d: Path, tier: int) -> int:
    """Ranks of the registered launches of tiers below ``tier`` without a context yet."""
    left = 0
    for f in d.glob("launch.*"):
        _, t, launch = f.name.split(".", 2)
        if int(t) < tier:
            try:
                ranks = int(f.read_text())
            except (OSError, ValueError):
                continue
            left += max(0, ranks - len(list(d.glob(f"ready.{launch}.*"))))
    return left


def wait_turn(env=None, wait_s: float = WAIT_S) -> float:
    """A rank, before its CUDA context: wait (bounded) for the ranks before it. Returns the
    seconds waited (0 without a gate)."""
    gate = parse((os.environ if env is None else env).get(VAR))
    if gate is None:
        return 0.0
    d, tier, _ = gate
    t0 = time.time()
    while waiting_for(d, tier) and time.time() - t0 < wait_s:
        time.sleep(POLL_S)
    return time.time() - t0


def ready(rank: int, env=None) -> None:
    """A rank, once its CUDA context exists: the ranks after it may go."""
    gate = parse((os.environ if env is None else env).get(VAR))
    if gate is not None:
        d, _, launch = gate
        (d / f"ready.{launch}.{rank}").touch()
