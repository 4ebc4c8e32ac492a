"""How this process runs its cases: a work dir for checkpoints, the :class:`Launcher` (torchrun
jobs) and the :class:`Scheduler` (which tasks go in which launch)."""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from pathlib import Path

from harness.launch import interrupt, rank_server, scratch
from harness.launch.launch import run_env
from harness.launch.lanes import MAX_RANKS
from harness.launch.launcher import Launcher
from harness.launch.rank_server import RankServer
from harness.launch.scheduler import Scheduler
from harness.plugin import options
from harness.spec.matrix import Case
from harness.speed import bytecode_cache, layers, task_seconds


def scope_of(case: Case) -> str:
    """The cases one xdist worker runs together (they share launches): same world sizes."""
    return "w" + "to".join(map(str, case.world_sizes))


# launches at once per GPU slice unless --launches-per-gpu says otherwise (the cases are small:
# one launch leaves a GPU mostly idle) -- or one per module of a world size's cases where they
# use more (placement.launches_per_slice)
LAUNCHES_PER_GPU = 4


def chosen(config) -> layers.Accelerations:
    """The acceleration layers ``--accelerations`` names (speed/layers.py; default all)."""
    return layers.parse(config.getoption("accelerations") or "all")


def accelerations(hs) -> layers.Accelerations:
    """The layers this run uses: :func:`chosen`, less those its other options and its host
    turn off (each layer's ``also_off``). The one answer the launches and ranks ask
    (``Launcher.speed``, ``layers.active``)."""
    acc = chosen(hs.config)
    if rank_start(hs) != "fork":
        acc = acc.without("rank_server", "stager_fork", "stager_no_gpu")
    if hs.device != "cuda":
        acc = acc.without("stager_prestart", "stager_no_gpu", "lane_per_module",
                          "lanes_per_gpu", "pool_lanes", "cpu_priority")
    if hs.device != "cuda" or len(hs.env.visible_gpus()) < 2:  # measured on 2 GPUs only
        acc = acc.without("context_order")
    if hs.config.getoption("launches_per_gpu") is not None:
        acc = acc.without("lane_per_module")
    if getattr(hs.config, "cache", None) is None:
        acc = acc.without("task_seconds")
    return acc


def rank_start(hs) -> str:
    """How this run's launches start their agents and ranks: "fork" (from the run's rank
    server) where ``--rank-start`` says so (auto: unless a cuda run sees no GPU -- every case
    skips there), the accelerations include the rank server and the run has one node, else
    "fresh" (a new Python each: the plain path)."""
    opt = hs.config.getoption
    mode = opt("rank_start")
    if mode == "auto":
        mode = "fresh" if hs.device == "cuda" and not hs.env.visible_gpus() else "fork"
    if opt("nnodes") != 1 or opt("node_launcher") or not rank_server.available() or \
            "rank_server" not in chosen(hs.config):
        return "fresh"
    return mode


def rank_start_recorded(hs, launches: list[dict]) -> str:
    """What the run's meta says of its ranks' start: :func:`rank_start`, and where the run
    forks but launches started fresh (the server broke or its imports failed), how many and
    the first one's reason (each launch record's ``fresh_ranks``)."""
    mode, fresh = rank_start(hs), [r["fresh_ranks"] for r in launches if r.get("fresh_ranks")]
    if mode == "fork" and fresh:
        return f"fork ({len(fresh)} of {len(launches)} launches fresh: {fresh[0]})"
    return mode


def execution_meta(hs, launches: list[dict]) -> dict:
    """The run meta's account of how it ran: its ranks' start (:func:`rank_start_recorded`),
    its acceleration layers (:func:`accelerations`), where its processes kept their bytecode
    (speed/bytecode_cache.py) and how many of its tasks had the last run's seconds to be
    scheduled by (task_seconds.py)."""
    ex, acc = hs.execution, accelerations(hs)
    return {"rank_start": rank_start_recorded(hs, launches),
            "accelerations": acc.describe(),
            "bytecode": bytecode_cache.describe(run_env(hs.device, acc.env())),
            "task_seconds_known": ex.seconds_known if ex is not None else None,
            "tasks": ex.task_records() if ex is not None else [],
            "max_ranks": ex.launcher.max_ranks if ex is not None and ex.launcher else None,
            "launches_per_gpu":
                ex.launcher.launches_per_gpu if ex is not None and ex.launcher else None}


def rank_server_for(hs) -> RankServer | None:
    """The run's rank server, started now (its imports overlap collection), where the run's
    ranks fork (:func:`rank_start`) and this process will run launches; else None."""
    xdist_controller = bool(getattr(hs.config.option, "numprocesses", None)) and \
        hs.worker_id is None
    if rank_start(hs) != "fork" or hs.config.getoption("collectonly") or xdist_controller:
        return None
    return RankServer(hs.backend, run_env(hs.device, accelerations(hs).env())).start()


class Execution:
    """The ``work`` dir, the ``launcher`` and the ``scheduler`` of this process's runnable
    cases (the work dir is made first, so that :meth:`cleanup` removes it whatever happens
    after)."""

    def __init__(self, run_id: str, work_dir: str | None):
        if work_dir:
            Path(work_dir).mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix=scratch.prefix(run_id),
                                          dir=work_dir or options.default_work_parent()))
        self.launcher: Launcher | None = None
        self.scheduler: Scheduler | None = None
        self.seconds: dict[str, float] = {}  # task -> its seconds in the last run (for_run)
        self.seconds_known: str | None = None  # tasks with the last run's seconds (start)
        self.stacks = None  # kill -USR1 <pytest pid>: its threads' stacks, beside the launches

    @classmethod
    def for_run(cls, hs) -> "Execution":
        """The work dir and launcher of a HarnessSession ``hs`` (its options, environment and
        run record, which gets each launch's record). On cuda each GPU slice takes
        ``--launches-per-gpu`` launches at once (default ``LAUNCHES_PER_GPU`` or one per module
        of a world size's cases, where more)."""
        ex = cls(hs.run_id, hs.config.getoption("work_dir"))
        opt = hs.config.getoption
        acc = accelerations(hs)
        ex.launcher = Launcher(
            hs.launches_dir, hs.backend, hs.device, gpus=hs.env.visible_gpus(),
            nnodes=opt("nnodes"), rdzv_endpoint=opt("rdzv_endpoint"),
            node_launcher=shlex.split(opt("node_launcher")) if opt("node_launcher") else None,
            launches_per_gpu=opt("launches_per_gpu") or LAUNCHES_PER_GPU,
            lane_per_module="lane_per_module" in acc,
            gpu_share=opt("gpu_share"), rank_server=hs.rank_server, env=acc.env(),
            max_ranks=MAX_RANKS if opt("max_ranks") is None else opt("max_ranks"))
        ex.launcher.on_record.append(hs.record.on_launch)
        ex.seconds = task_seconds.load(hs.config, hs.device) if "task_seconds" in acc else {}
        ex.stacks = interrupt.stacks_on_sigusr1(hs.launches_dir / "pytest-stacks.txt")
        return ex

    def start(self, cases: list[Case], *, per_scope: bool, after=None) -> None:
        """The scheduler of the run's runnable ``cases``; ``per_scope``: one scheduling scope
        per world size (xdist workers), else one for all. On a small CPU box one launch runs at
        a time (overlapping launches would only fight over the cores). It weighs the tasks by
        the seconds they took in the last run, where known (task_seconds.py, ``for_run``). The
        lanes start at once. ``after``: sees each batch of results (the scheduler's)."""
        self.scheduler = Scheduler(self.launcher, cases, self.work / "ckpt",
                                   scope_of=scope_of if per_scope else (lambda c: "all"),
                                   concurrency=None if self.launcher.device == "cuda"
                                   else max(1, (os.cpu_count() or 1) // 4), seconds=self.seconds,
                                   after=after)
        tasks = self.scheduler.graph.all
        self.launcher.expect(cases, tasks, self.seconds)
        self.seconds_known = f"{sum(t.name in self.seconds for t in tasks)} of {len(tasks)}"
        self.scheduler.begin()

    def task_records(self) -> list[dict]:
        """Each task that ran to its end: its world size, its case's world sizes, module,
        recipe, process-group backend, seconds, launch and start -- what the scaling model
        (report/scaling.py) predicts other hosts' wall time from."""
        if self.scheduler is None:
            return []
        graph = self.scheduler.graph
        return [dict(name=t.name, world=t.world_size, worlds=list(t.case.world_sizes),
                     module=t.case.ax.get("module"), recipe=t.case.recipe,
                     pg=graph.key(t)[2], seconds=round(r.seconds, 3), launch=r.launch,
                     started=round(r.started, 3))
                for t in graph.all if (r := graph.done.get(t.name)) is not None
                and r.status == "ok" and r.seconds > 0]

    def shutdown(self, config=None, device: str = "") -> None:
        """The lanes end: at once if every case has its result, else they are stopped (a run
        cut short by -x, --maxfail or Ctrl-C). Bounded. Then the rank server they forked
        from may end (it exits while the run writes its results; unconfigure reaps it), and the
        tasks' seconds go to pytest's cache of ``config`` for the next run."""
        if self.scheduler is not None:
            self.scheduler.shutdown()
        if self.launcher is not None and self.launcher.rank_server is not None:
            self.launcher.rank_server.close()
        if self.scheduler is not None:
            task_seconds.store(config, device, self.scheduler.graph.measured_s())

    def cleanup(self, keep_work: bool) -> None:
        interrupt.no_stacks_on_sigusr1(self.stacks)
        self.stacks = None
        if not keep_work:
            shutil.rmtree(self.work, ignore_errors=True)
