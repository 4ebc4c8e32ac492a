"""The launch side of the ``context_order`` layer: which launches' ranks make their CUDA
contexts first (worker/context_gate.py says why and how a rank waits).

The launches that start in the run's first :data:`WINDOW_S` seconds -- the lanes the scheduler
starts at once -- are ordered by tier, the largest world first (``tiers``); each registers its
ranks in the run's gate directory before its agents start. Launches after the window (a lane
started later, a launch after a crash) neither wait nor hold anyone up. One-node GPU runs only:
on CPU no rank makes a context, and a rank on another node would wait for files it cannot see.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from harness.worker import context_gate

WINDOW_S = 30.0
_LOCK = threading.Lock()


def env_for(launcher, world_size: int, launch: str) -> dict:
    """:meth:`ContextOrder.env` of ``launcher``'s order (made at its first launch, when the
    run's worlds are known: ``Lanes.expect``), or nothing where the layer does not apply."""
    if launcher.device != "cuda" or launcher.nnodes != 1 or launcher.node_launcher \
            or "context_order" not in launcher.speed:
        return {}
    with _LOCK:
        if launcher.context_order is None:
            launcher.context_order = ContextOrder(launcher.root / "context_gate",
                                                  launcher.modules)
    return launcher.context_order.env(world_size, launch)


class ContextOrder:
    def __init__(self, gate_dir: Path, worlds, window_s: float = WINDOW_S):
        self.dir, self.window_s = Path(gate_dir), window_s
        self.tiers = {w: i for i, w in enumerate(sorted(set(worlds), reverse=True))}
        self._until: float | None = None  # the window's end, from the first launch
        self._lock = threading.Lock()

    def env(self, world_size: int, launch: str) -> dict:
        """What launch ``launch`` of ``world_size`` ranks adds to its environment: the gate,
        registered, where it starts within the window and the run has more than one tier."""
        with self._lock:
            now = time.time()
            if self._until is None:
                self._until = now + self.window_s
            if now > self._until or len(self.tiers) < 2 or world_size not in self.tiers:
                return {}
            tier = self.tiers[world_size]
            context_gate.register(self.dir, tier, launch, world_size)
        return {context_gate.VAR: f"{self.dir}|{tier}|{launch}"}
