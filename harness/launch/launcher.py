"""Run tasks (case phases) under real torchrun, one world size and GPU slot per *lane*: a
sequence of launches (``launch.Launch``) taking their tasks from the lane's feed (``feed.py``),
so a run pays one process start per world size and slot, not one per batch. After a timeout or
crash the lane starts a new launch with what the dead one left. :meth:`Launcher.run_batch`
runs a fixed list of tasks the same way (tests, simple callers).
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from pathlib import Path

from harness.launch import procs
from harness.launch.feed import FixedFeed
from harness.launch.interrupt import Interrupted
from harness.launch.launch import SAFE_ENV, TORCHRUN, Launch, LaunchSettings
from harness.launch.launch_dir import stager_worlds
from harness.launch.placement import (case_backend, launch_env, launches_per_slice, place,
                                      pool_shares)
from harness.launch.tasks import LaunchRecord, Task, TaskResult
from harness.speed import layers
from harness.speed.lane_choice import extra_lanes

__all__ = ["Launcher", "Launch", "LaunchRecord", "Task", "TaskResult", "SAFE_ENV", "STOP_JOIN_S"]

STOP_JOIN_S = 60.0  # bounded wait for GPU-slot threads after a stop
# --max-ranks default: rank processes of all launches at once on a GPU host. Every task slows
# down as a host runs more (its CUDA contexts start one after another, host-wide): the whole
# TE matrix on 2 H200s took 72.6-74.1 s with 42, 86.7-88.0 s with 62 and 150 s with 100
MAX_RANKS = 42


class Launcher:
    """Starts launches: lanes fed by the scheduler (:meth:`run_lane`) or fixed batches
    (:meth:`run_batch`); the argv of a launch; the records of every launch."""

    def __init__(self, root: Path, backend: str, device: str, *, collective_timeout_s=60.0,
                 startup_timeout_s=180.0, env: dict | None = None, python: str = sys.executable,
                 gpus: list[str] | None = None, nnodes: int = 1, rdzv_endpoint: str | None = None,
                 node_launcher: list[str] | None = None, launches_per_gpu: int = 1,
                 lane_per_module: bool = False, gpu_share: str = "auto", rank_server=None,
                 max_ranks: int = 0):
        self.root = Path(root)
        self.backend, self.device = backend, device
        self.gpus = list(gpus or [])  # visible GPU ids (respecting CUDA_VISIBLE_DEVICES)
        # GPU oversubscription: each GPU slice takes this many launches at once (the cases are
        # tiny; one launch leaves a GPU mostly idle). Bounded by --launches-per-gpu.
        self.launches_per_gpu = max(1, int(launches_per_gpu))
        self.lane_per_module = lane_per_module  # or one per module (launches_per_slice)
        self.modules: dict[int, set] = {}  # world size -> the modules of its cases (expect)
        self.extra: dict[int, int] = {}  # world size -> lanes beyond one a module (expect)
        self.share: dict[tuple, float] = {}  # (world, pg) -> its share of the world's tasks
        # every world's lanes times this, where they would start more than max_ranks ranks
        self.max_ranks, self.scale = max_ranks, 1.0
        self.gpu_share = gpu_share  # ranks share GPUs over gloo where too few (placement.py)
        # Multi-node: `nnodes` torchrun agents meet at a c10d rendezvous, started by one
        # `node_launcher` command (["srun", ...]) or on this host (simulated nodes, in CI).
        self.nnodes = nnodes
        self.rdzv_endpoint = rdzv_endpoint
        self.node_launcher = list(node_launcher or [])
        self.collective_timeout_s = collective_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.extra_env, self.speed = dict(env or {}), layers.from_env(env or {})  # speed/layers
        self.python = python
        self.records: list[LaunchRecord] = []
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.on_record: list = []  # callbacks(LaunchRecord), called as each launch ends
        self.stager_worlds: set[int] = set()  # launch_dir.stager_worlds() of the run's cases
        self.largest_world = 0  # of the run's tasks: ranks' CPU priorities (placement.py)
        # launches fork their agents and ranks from the run's rank server where the caller
        # gave one (the plugin decides: plugin/execution.rank_start); else fresh Pythons
        if rank_server is not None and (nnodes != 1 or node_launcher):
            raise ValueError("a rank server forks the agents of one-node launches only")
        self.rank_server = rank_server

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
        if self.device == "cuda" and "pool_lanes" in self.speed:
            self.share = pool_shares(tasks, lambda c: case_backend(c, self))
        if seconds and self.lane_per_module and self.device == "cuda":  # lane_choice.py
            self.extra = extra_lanes(tasks, seconds, lambda w: len(self.slots(w)),
                                     len(os.sched_getaffinity(0)))
        if self.device == "cuda" and self.max_ranks:
            self.scale = 1.0
            pools = {(t.world_size, case_backend(t.case, self)) for t in tasks}
            ranks = sum(len(self.slots(w, pg)) * w for w, pg in pools)
            self.scale = min(1.0, self.max_ranks / ranks) if ranks else 1.0

    def stop(self) -> None:
        """Make every running launch end now (its processes killed) and no new one start."""
        self._stop.set()

    # ------------------------------------------------------------------------------------
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
        modules = len(self.modules.get(world_size, ())) if self.lane_per_module else 0
        n = launches_per_slice(p, self.launches_per_gpu, modules, self.extra.get(world_size, 0),
                               per_gpu_world=world_size if "lanes_per_gpu" in self.speed else 0)
        n = max(1, round(n * self.scale * self.share.get((world_size, pg_backend), 1.0)))
        return [{"CUDA_VISIBLE_DEVICES": ",".join(sl), **shared}
                for _ in range(n) for sl in p.slices]

    def run_batch(self, tasks: list[Task], world_size: int, env: dict | None = None) -> dict:
        """Run ``tasks`` (all of ``world_size``) as one lane on the first GPU slot; re-launch
        after a timeout or crash until each task has a result. Returns name -> TaskResult."""
        feed = FixedFeed(tasks)
        self.run_lane(feed, world_size, {**(env or {}), **self.slots(world_size)[0]})
        return feed.results

    def run_lane(self, feed, world_size: int, env: dict) -> None:
        """Launch after launch on one slot until ``feed`` closes: each launch starts with what
        ``feed.wait`` gives and is fed while it lives; what a timeout or crash left unfinished
        goes back with ``feed.requeue``. Results reach ``feed.finished``."""
        retry_start = True  # one new launch after a launch that failed before its first task
        while True:
            tasks = feed.wait(self._stop)
            if self._stop.is_set():
                raise Interrupted("the run is being stopped")
            if not tasks:
                return
            launch = self._launch(tasks, world_size, env, feed, retry_start)
            got = launch.run()
            retry_start = not launch.start_failed
            if not got and not launch.start_failed:  # never loop forever
                raise RuntimeError(f"launch {launch.name} produced no result")
            left = launch.unfinished()
            if left:
                feed.requeue(left)

    def _launch(self, tasks, world_size: int, env: dict, feed, retry_start: bool) -> Launch:
        """A launch of ``tasks`` on slot ``env``, with everything it needs handed to it."""
        name, d = self.new_dir()
        settings = LaunchSettings(
            backend=self.backend, device=self.device,
            collective_timeout_s=self.collective_timeout_s,
            startup_timeout_s=self.startup_timeout_s, extra_env=self.extra_env,
            gentle_stop=bool(self.node_launcher),
            stager=world_size in self.stager_worlds, rank_server=self.rank_server)
        return Launch(settings, name, d, lambda plan: self.commands(plan, world_size, name),
                      tasks, world_size, env, feed, stop=self._stop, on_record=self.add_record,
                      retry_start=retry_start)

    def new_dir(self) -> tuple[str, Path]:
        with self._lock:
            name = f"L{next(self._counter):03d}"
        d = self.root / name
        for sub in ("logs", "stacks", "progress", "results", "queue"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        return name, d

    def commands(self, plan_path: Path, world_size: int, launch: str) -> list[list[str]]:
        """The argv lists to start for one launch (no shell)."""
        worker = ["--max-restarts=0", "--monitor-interval=0.1", "-m", "harness.worker",
                  "--plan", str(plan_path)]
        # torchrun, SIGKILLed by the kernel if this process dies (srun is not our child's
        # parent on the remote nodes: no --parent there)
        parent = [] if self.node_launcher else ["--parent", str(os.getpid())]
        torchrun = [self.python, "-m", "harness.launch.tethered", *parent, TORCHRUN]
        if self.nnodes == 1:
            return [torchrun + ["--standalone", f"--nproc-per-node={world_size}"] + worker]
        if world_size % self.nnodes:
            raise ValueError(f"world size {world_size} does not split over {self.nnodes} nodes")
        endpoint = self.rdzv_endpoint or f"127.0.0.1:{procs.free_port()}"
        agent = torchrun + [f"--nnodes={self.nnodes}",
                            f"--nproc-per-node={world_size // self.nnodes}",
                            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                            f"--rdzv-id={launch}-{os.getpid()}"] + worker
        if self.node_launcher:
            return [self.node_launcher + agent]
        return [agent for _ in range(self.nnodes)]

    def add_record(self, rec: LaunchRecord) -> None:
        with self._lock:
            self.records.append(rec)
        for cb in self.on_record:
            cb(rec)
