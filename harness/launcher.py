"""Run tasks (case phases) under real torchrun, one world size and GPU slot per *lane*.

A lane is a sequence of launches (:class:`harness.launch.Launch`) that pulls its tasks from a
source (the scheduler): the launch starts with what is ready and is fed more while it lives, so
a whole run pays one process start, import and process-group set-up per world size and GPU slot
-- not one per batch. After a timeout or crash the lane starts a new launch with the tasks the
dead one left unfinished (and whatever the source has by then). :meth:`Launcher.run_batch` runs
a fixed list of tasks the same way, spread over the GPU slots (tests, simple callers).
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from pathlib import Path
from typing import Protocol

from . import procs
from .agent_server import Servers
from .early_launches import EarlyLaunches
from .interrupt import Interrupted
from .launch import SAFE_ENV, Launch, TaskSource, scratch_parent
from .tasks import LaunchRecord, Task, TaskResult

__all__ = ["Launcher", "Launch", "LaunchRecord", "Task", "TaskResult", "TaskSource", "SAFE_ENV",
           "STOP_JOIN_S", "StaticSource"]

STOP_JOIN_S = 60.0  # bounded wait for GPU-slot threads after a stop


class Lane(Protocol):
    """A :class:`TaskSource` that a lane also asks for its first tasks and gives back what a
    dead launch left unfinished."""

    def first(self) -> list[Task] | None:
        """Block until tasks are ready for a new launch; None once the lane has no more."""

    def requeue(self, tasks: list[Task]) -> None:
        """Tasks a launch left unfinished (timeout / crash): run them again."""


class StaticSource:
    """A lane over a fixed list of tasks: all of them in the first launch, the unfinished ones
    again after a timeout or crash, nothing fed."""

    def __init__(self, tasks: list[Task]):
        self.left, self.results = list(tasks), {}
        self.timeout_s = max((t.case.timeout_s for t in tasks), default=0.0)

    def first(self) -> list[Task] | None:
        out, self.left = self.left, []
        return out or None

    def more(self, launch) -> None:
        return None

    def finished(self, results: dict[str, TaskResult]) -> None:
        self.results.update(results)

    def requeue(self, tasks: list[Task]) -> None:
        self.left = [t for t in tasks if t.name not in self.results]


def fork_ranks(rank_start: str, device: str) -> bool:
    """Ranks forked from an agent that imported their modules (harness/fork_agent.py) or a
    fresh Python each (torchrun's own way); auto: fork on CPU, fresh on cuda (the library under
    test may touch CUDA when imported, and CUDA does not survive a fork)."""
    if rank_start not in ("auto", "fork", "fresh"):
        raise ValueError(f"rank_start {rank_start!r}: expected auto, fork or fresh")
    return rank_start == "fork" or (rank_start == "auto" and device != "cuda")


class Launcher:
    """Starts launches: lanes fed by the scheduler (:meth:`run_lane`) or fixed batches
    (:meth:`run_batch`); the argv of a launch; the records of every launch."""

    def __init__(self, root: Path, backend: str, device: str, *, collective_timeout_s=60.0,
                 startup_timeout_s=180.0, env: dict | None = None, python: str = sys.executable,
                 gpus: list[str] | None = None, nnodes: int = 1, rdzv_endpoint: str | None = None,
                 node_launcher: list[str] | None = None, launches_per_gpu: int = 1,
                 rank_start: str = "auto", agent_server: bool = True):
        self.root = Path(root)
        self.backend, self.device = backend, device
        self.gpus = list(gpus or [])  # visible GPU ids (respecting CUDA_VISIBLE_DEVICES)
        # GPU oversubscription: each GPU slice takes this many launches at once (the cases are
        # tiny; one launch leaves a GPU mostly idle). Bounded by --launches-per-gpu.
        self.launches_per_gpu = max(1, int(launches_per_gpu))
        # Multi-node: the world is split over `nnodes` torchrun agents meeting at a c10d
        # rendezvous. With `node_launcher` (e.g. ["srun", "--nodes=2", "--ntasks-per-node=1"])
        # one command starts an agent per node; without it the agents run on this host
        # (simulated nodes, how CI tests this path).
        self.nnodes = nnodes
        self.rdzv_endpoint = rdzv_endpoint
        self.node_launcher = list(node_launcher or [])
        self.collective_timeout_s = collective_timeout_s
        self.fork_ranks = fork_ranks(rank_start, device)
        self.startup_timeout_s = startup_timeout_s
        self.extra_env = dict(env or {})
        self.python = python
        self.records: list[LaunchRecord] = []
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.salvaged: dict[str, TaskResult] = {}  # tasks finished by launches cut short
        # launches started before a lane had tasks for them (harness/early_launches.py)
        self.early = EarlyLaunches(self)
        # forked ranks' agents forked from a process with their modules imported, not started
        # as fresh Pythons (harness/agent_server.py); ended by close() or when idle
        self.agent_servers = Servers(python, scratch_parent()) \
            if self.fork_ranks and agent_server and not self.node_launcher else None
        self.on_record: list = []  # callbacks(LaunchRecord), called as each launch ends
        self.stager_worlds: set[int] = set()  # launch_dir.stager_worlds() of the run's cases

    def stop(self) -> None:
        """Make every running launch end now (its processes killed) and no new one start."""
        self._stop.set()
        self.early.discard()

    def close(self) -> None:
        """End the agent servers (a later launch starts one again)."""
        if self.agent_servers:
            self.agent_servers.close()

    # ------------------------------------------------------------------------------------
    def slots(self, world_size: int) -> list[dict]:
        """GPU slot packing: with G visible GPUs, G // world_size slices of world_size GPUs,
        each taking ``launches_per_gpu`` launches at once (on its own CUDA_VISIBLE_DEVICES).
        One slot (no env) on CPU."""
        if self.device != "cuda" or not self.gpus:
            return [{}]
        n = max(len(self.gpus) // world_size, 1)
        slices = [",".join(self.gpus[i * world_size:(i + 1) * world_size]) for i in range(n)]
        return [{"CUDA_VISIBLE_DEVICES": sl} for _ in range(self.launches_per_gpu)
                for sl in slices]

    def run_batch(self, tasks: list[Task], world_size: int, env: dict | None = None) -> dict:
        """Run ``tasks`` (all of ``world_size``), spread over the GPU slots; re-launch after a
        timeout or crash until each task has a result. Returns name -> TaskResult."""
        slots = self.slots(world_size)
        by_case: dict[str, list[Task]] = {}
        for t in tasks:  # a case's tasks stay together (reshard may follow train in one launch)
            by_case.setdefault(t.case.key, []).append(t)
        chunks = [[] for _ in slots]
        for i, group in enumerate(by_case.values()):
            chunks[i % len(slots)].extend(group)
        jobs = [(chunk, {**(env or {}), **slot}) for chunk, slot in zip(chunks, slots) if chunk]
        if len(jobs) == 1:
            return self._run_chunk(jobs[0][0], world_size, jobs[0][1])
        results: dict[str, TaskResult] = {}
        errors: list[BaseException] = []

        def work(chunk, slot_env):
            try:
                got = self._run_chunk(chunk, world_size, slot_env)
                with self._lock:
                    results.update(got)
            except BaseException as e:  # surfaced below, after every slot finished
                errors.append(e)

        threads = [threading.Thread(target=work, args=job, daemon=True) for job in jobs]
        for th in threads:
            th.start()
        try:
            for th in threads:
                th.join()
        except BaseException:  # Ctrl-C in the main thread: stop the slots' launches too
            self.stop()
            for th in threads:
                th.join(timeout=STOP_JOIN_S)
            raise
        if errors:
            raise errors[0]
        return results

    def _run_chunk(self, tasks: list[Task], world_size: int, env: dict) -> dict:
        source = StaticSource(tasks)
        self.run_lane(source, world_size, env)
        return source.results

    def run_lane(self, source, world_size: int, env: dict) -> None:
        """Launch after launch on one slot until ``source`` has no more tasks: each launch
        starts with ``source.first()`` and is fed while it lives; what a timeout or crash
        left unfinished goes back with ``source.requeue``. Results reach ``source.finished``."""
        retry_start = True  # one new launch after a launch that failed before its first task
        while True:
            if self._stop.is_set():
                raise Interrupted("the run is being stopped")
            tasks = source.first()
            if not tasks:
                return
            launch = self.early.take(world_size, env, source.timeout_s)
            if launch is not None:
                launch.adopt(source, tasks, retry_start)
            else:
                launch = Launch(self, tasks, world_size, env, source, retry_start=retry_start)
            got = launch.run()
            retry_start = not launch.start_failed
            if not got and not launch.start_failed:  # never loop forever
                raise RuntimeError(f"launch {launch.name} produced no result")
            left = launch.unfinished()
            if left:
                source.requeue(left)

    def new_dir(self) -> tuple[str, Path]:
        with self._lock:
            name = f"L{next(self._counter):03d}"
        d = self.root / name
        for sub in ("logs", "stacks", "progress", "results", "queue"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        return name, d

    def commands(self, plan_path: Path, world_size: int, launch: str) -> list[list[str]]:
        """The argv lists to start for one launch (no shell)."""
        return torchrun_argvs(self, plan_path, world_size, launch)

    def add_record(self, rec: LaunchRecord) -> None:
        with self._lock:
            self.records.append(rec)
        for cb in self.on_record:
            cb(rec)


def torchrun_argvs(launcher: Launcher, plan_path: Path, world_size: int,
                   launch: str) -> list[list[str]]:
    """The argv lists to start for one launch of ``launcher`` (no shell)."""
    worker = ["--max-restarts=0", "--monitor-interval=0.1", "-m", "harness.worker",
              "--plan", str(plan_path)]
    # torchrun, SIGKILLed by the kernel if this process dies (srun is not our child's
    # parent on the remote nodes: no --parent there)
    parent = [] if launcher.node_launcher else ["--parent", str(os.getpid())]
    agent = "harness.fork_agent" if launcher.fork_ranks else "torch.distributed.run"
    torchrun = [launcher.python, "-m", "harness.tethered", *parent, agent]
    if launcher.nnodes == 1:
        return [torchrun + ["--standalone", f"--nproc-per-node={world_size}"] + worker]
    if world_size % launcher.nnodes:
        raise ValueError(f"world size {world_size} does not split over {launcher.nnodes} nodes")
    endpoint = launcher.rdzv_endpoint or f"127.0.0.1:{procs.free_port()}"
    agent = torchrun + [f"--nnodes={launcher.nnodes}",
                        f"--nproc-per-node={world_size // launcher.nnodes}",
                        "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                        f"--rdzv-id={launch}-{os.getpid()}"] + worker
    if launcher.node_launcher:
        return [launcher.node_launcher + agent]
    return [agent for _ in range(launcher.nnodes)]
