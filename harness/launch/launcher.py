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

from harness.launch import context_order, procs
from harness.launch.feed import FixedFeed
from harness.launch.interrupt import Interrupted
from harness.launch.launch import SAFE_ENV, TORCHRUN, Launch, LaunchSettings
from harness.launch.lanes import Lanes
from harness.launch.tasks import LaunchRecord, Task, TaskResult
from harness.speed import layers

__all__ = ["Launcher", "Launch", "LaunchRecord", "Task", "TaskResult", "SAFE_ENV", "STOP_JOIN_S"]

STOP_JOIN_S = 60.0  # bounded wait for GPU-slot threads after a stop


class Launcher(Lanes):
    """Starts launches: lanes fed by the scheduler (:meth:`run_lane`) or fixed batches
    (:meth:`run_batch`); the argv of a launch; the records of every launch. How many lanes
    each world size gets, on which GPUs: :class:`~harness.launch.lanes.Lanes`."""

    def __init__(self, root: Path, backend: str, device: str, *, collective_timeout_s=60.0,
                 startup_timeout_s=180.0, env: dict | None = None, python: str = sys.executable,
                 gpus: list[str] | None = None, nnodes: int = 1, rdzv_endpoint: str | None = None,
                 node_launcher: list[str] | None = None, launches_per_gpu: int = 1,
                 lane_per_module: bool = False, gpu_share: str = "auto", rank_server=None,
                 max_ranks: int = 0):
        self.root = Path(root)
        self.backend, self.device = backend, device
        self.extra_env, self.speed = dict(env or {}), layers.from_env(env or {})  # speed/layers
        self.init_lanes(gpus, launches_per_gpu, lane_per_module, gpu_share, max_ranks)
        # Multi-node: `nnodes` torchrun agents meet at a c10d rendezvous, started by one
        # `node_launcher` command (["srun", ...]) or on this host (simulated nodes, in CI).
        self.nnodes = nnodes
        self.rdzv_endpoint, self.node_launcher = rdzv_endpoint, list(node_launcher or [])
        self.collective_timeout_s = collective_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.python = python
        self.records: list[LaunchRecord] = []
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.on_record: list = []  # callbacks(LaunchRecord), called as each launch ends
        # launches fork their agents and ranks from the run's rank server where the caller
        # gave one (the plugin decides: plugin/execution.rank_start); else fresh Pythons
        if rank_server is not None and (nnodes != 1 or node_launcher):
            raise ValueError("a rank server forks the agents of one-node launches only")
        self.rank_server = rank_server

    def stop(self) -> None:
        """Make every running launch end now (its processes killed) and no new one start."""
        self._stop.set()

    # ------------------------------------------------------------------------------------
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
        env = {**env, **context_order.env_for(self, world_size, name)}  # CUDA contexts' order
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
