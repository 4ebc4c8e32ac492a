"""How many lanes (concurrent launches) each world size gets and on which GPUs: the launcher's
lane policy (placement.py's functions, the run's cases and the host), apart from its
process management. No process starts here."""

from __future__ import annotations

import os

from harness.launch.launch_dir import stager_worlds
from harness.launch.placement import (case_backend, fit_lanes, launch_env, launches_per_slice,
                                      place, pool_shares)
from harness.speed.lane_choice import extra_lanes

# --max-ranks default: rank processes of all launches at once on a GPU host. Every task slows
# down as a host runs more, whatever its GPUs (their CUDA contexts start one after another,
# host-wide); measured: docs/performance.md, "Where the 2-GPU time went" and "Tried and not kept"
MAX_RANKS = 42


class Lanes:
    """The lane counts and slot environments of a launcher (its base class)."""

    def init_lanes(self, gpus, launches_per_gpu: int, lane_per_module: bool, gpu_share: str,
                   max_ranks: int) -> None:
        self.gpus = list(gpus or [])  # visible GPU ids (respecting CUDA_VISIBLE_DEVICES)
        # GPU oversubscription: each GPU slice takes this many launches at once (the cases are
        # tiny; one launch leaves a GPU mostly idle). Bounded by --launches-per-gpu.
        self.launches_per_gpu = max(1, int(launches_per_gpu))
        self.lane_per_module = lane_per_module  # or one per module (launches_per_slice)
        self.modules: dict[int, set] = {}  # world size -> the modules of its cases (expect)
        self.extra: dict[int, int] = {}  # world size -> lanes beyond one a module (expect)
        self.share: dict[tuple, float] = {}  # (world, pg) -> its share of the world's tasks
        # at most this many ranks at once (0: no bound): (world, pg) -> its lanes a GPU slice,
        # fitted to the bound by expect() (placement.fit_lanes)
        self.max_ranks, self.fitted = max_ranks, {}
        self.gpu_share = gpu_share  # ranks share GPUs over gloo where too few (placement.py)
        self.stager_worlds: set[int] = set()  # launch_dir.stager_worlds() of the run's cases
        self.largest_world = 0  # of the run's tasks: ranks' CPU priorities (placement.py)
        self.cores: int | None = None  # the host's (None: this process's CPUs; extra_lanes)
        self.context_order = None  # the first launches' CUDA contexts (launch/context_order.py)

    def expect(self, cases, tasks=(), seconds: dict[str, float] | None = None) -> None:
        """On GPU hosts every launch that may run an async_process save starts DCP's stager up
        front, also when its tasks come through the feed: a launch's first such save then does
        not wait for the stager to start. Not on CPU: on a few cores the stagers' start competes
        with the busy lane and makes the run slower."""
        if self.device == "cuda" and "stager_prestart" in self.speed:
            self.stager_worlds |= stager_worlds(cases)
        self.largest_world = max([self.largest_world] + [w for c in cases for w in c.world_sizes])
        for c, w in ((c, w) for c in cases for w in c.world_sizes):
            self.modules.setdefault(w, set()).add(c.ax.get("module"))
        pools = [(t.world_size, case_backend(t.case, self)) for t in tasks]  # (world, pg)
        if self.device == "cuda" and "pool_lanes" in self.speed:
            self.share = pool_shares(pools)
        if seconds and self.lane_per_module and self.device == "cuda":  # lane_choice.py
            self.extra = extra_lanes(tasks, seconds, lambda w: len(self.slots(w)),
                                     self.cores or len(os.sched_getaffinity(0)))
        if self.device == "cuda" and self.max_ranks:
            wanted, cost = {}, {}
            for w, pg in set(pools):
                p = place(w, self.gpus, self.gpu_share)
                if p is not None:
                    wanted[(w, pg)], cost[(w, pg)] = self._wanted(w, pg, p), w * len(p.slices)
            self.fitted = fit_lanes(wanted, cost, self.max_ranks)

    def ranks(self, pools) -> int:
        """Rank processes the lanes of ``pools`` ((world, pg) pairs) run at once."""
        return sum(len(self.slots(w, pg)) * w for w, pg in pools)

    def slots(self, world_size: int, pg_backend: str = "") -> list[dict]:
        """The launch environments of a world size for cases on ``pg_backend`` (``placement``):
        each GPU slice (its CUDA_VISIBLE_DEVICES) taken by up to ``launches_per_gpu`` launches at
        once (or one per module of the world's cases: ``lane_per_module``), fewer where ranks
        share a GPU (``placement.launches_per_slice``). One slot (no env) on CPU."""
        p = place(world_size, self.gpus, self.gpu_share) if self.device == "cuda" else None
        if p is None:
            return [{"CUDA_VISIBLE_DEVICES": ",".join(self.gpus)}] if self.gpus and \
                self.device == "cuda" else [{}]
        largest = self.largest_world if "cpu_priority" in self.speed else world_size
        shared = launch_env(p, world_size, largest, pg_backend)
        n = self.fitted.get((world_size, pg_backend)) or \
            max(1, round(self._wanted(world_size, pg_backend, p)))
        return [{"CUDA_VISIBLE_DEVICES": ",".join(sl), **shared}
                for _ in range(n) for sl in p.slices]

    def _wanted(self, world_size: int, pg_backend: str, p) -> float:
        """Lanes a slice of placement ``p`` would take for the pool before any bound on the
        host's ranks: ``placement.launches_per_slice`` times the pool's share of its world."""
        modules = len(self.modules.get(world_size, ())) if self.lane_per_module else 0
        n = launches_per_slice(p, self.launches_per_gpu, modules, self.extra.get(world_size, 0),
                               per_gpu_world=world_size if "lanes_per_gpu" in self.speed else 0)
        return n * self.share.get((world_size, pg_backend), 1.0)
