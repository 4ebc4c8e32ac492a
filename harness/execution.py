"""How this process runs its cases: a work dir for checkpoints, the :class:`Launcher` (torchrun
jobs) and the :class:`Scheduler` (which tasks go in which launch)."""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from . import interrupt, options
from .early_launches import wanted
from .launch_dir import stager_worlds
from .launcher import Launcher
from .matrix import Case
from .scheduler import Scheduler
from .task_graph import TaskGraph


def scope_of(case: Case) -> str:
    """The cases one xdist worker runs together (they share launches): same world sizes."""
    return "w" + "to".join(map(str, case.world_sizes))


# launches at once per GPU slice unless --launches-per-gpu says otherwise (measured best of 3, 4
# and 6 on 2x H200: reports/bench/README.md)
LAUNCHES_PER_GPU = 4


class Execution:
    """The ``work`` dir, the ``launcher`` and the ``scheduler`` of this process's runnable
    cases (the work dir is made first, so that :meth:`cleanup` removes it whatever happens
    after)."""

    def __init__(self, run_id: str, work_dir: str | None):
        if work_dir:
            Path(work_dir).mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix=f"harness-{run_id}-",
                                          dir=work_dir or options.default_work_parent()))
        self.launcher: Launcher | None = None
        self.scheduler: Scheduler | None = None
        self.stacks = None  # kill -USR1 <pytest pid>: its threads' stacks, beside the launches

    def make_launcher(self, *, launches_dir: Path, backend: str, device: str, gpus: list[str],
                      nnodes: int, rdzv_endpoint: str | None, node_launcher: str | None,
                      on_launch: Callable, launches_per_gpu: int | None = None,
                      rank_start: str = "auto") -> Launcher:
        """The launcher (once); ``on_launch`` gets each launch's record. On cuda each GPU
        slice takes ``launches_per_gpu`` (None: ``LAUNCHES_PER_GPU``) launches at once.
        ``rank_start``: fork / fresh / auto (``Launcher``)."""
        if self.launcher is None:
            self.launcher = Launcher(
                launches_dir, backend, device, gpus=gpus, nnodes=nnodes,
                rdzv_endpoint=rdzv_endpoint,
                node_launcher=shlex.split(node_launcher) if node_launcher else None,
                launches_per_gpu=launches_per_gpu or LAUNCHES_PER_GPU, rank_start=rank_start)
            self.launcher.on_record.append(on_launch)
            self.stacks = interrupt.stacks_on_sigusr1(Path(launches_dir) / "pytest-stacks.txt")
        return self.launcher

    def start_early(self, cases: list[Case]) -> None:
        """Start the launches the lanes of ``cases`` will begin with, before collection ends
        (harness/early_launches.py); one scheduling scope."""
        self._expect(cases)
        for world_size, env, timeout_s in self._first_launches(cases):
            self.launcher.early.start(world_size, env, timeout_s)

    def keep_early(self, cases: list[Case]) -> None:
        """End the early launches that the lanes of ``cases`` would not take."""
        self.launcher.early.keep_only(self._first_launches(cases))

    def _first_launches(self, cases: list[Case]) -> list[tuple[int, dict, float]]:
        """What the lanes of ``cases`` (one scheduling scope) start with (``wanted``)."""
        return wanted(TaskGraph(cases, self.work / "ckpt", lambda c: "all"), self.launcher.slots)

    def start(self, cases: list[Case], *, per_scope: bool, device: str) -> None:
        """The scheduler of the run's runnable ``cases``; ``per_scope``: one scheduling scope
        per world size (xdist workers), else one for all. On a small CPU box one launch runs at
        a time (overlapping launches would only fight over the cores). Early launches the
        lanes will not take are ended; the lanes start at once."""
        self.scheduler = Scheduler(self.launcher, cases, self.work / "ckpt",
                                   scope_of=scope_of if per_scope else (lambda c: "all"),
                                   concurrency=None if device == "cuda"
                                   else max(1, (os.cpu_count() or 1) // 4))
        self._expect(cases)
        self.launcher.early.keep_only(wanted(self.scheduler.graph, self.launcher.slots))
        self.scheduler.begin()

    def _expect(self, cases: list[Case]) -> None:
        """On GPU hosts every launch that may run an async_process save starts DCP's stager up
        front, also when its tasks come through the feed (1x H200: a launch's first such save
        1.9-4.2 s -> 0.2-1.1 s). Not on CPU: on 2 cores the stagers' start then competes with
        the busy lane (a 40-case torch slice 23-26 s without, 29 s with, alternating)."""
        if self.launcher.device == "cuda":
            self.launcher.stager_worlds |= stager_worlds(cases)

    def shutdown(self) -> None:
        """The lanes end: at once if every case has its result, else they are stopped (a run
        cut short by -x, --maxfail or Ctrl-C). Bounded."""
        if self.scheduler is not None:
            self.scheduler.shutdown()
        if self.launcher is not None:  # early launches no lane took, the agent servers
            self.launcher.early.discard()
            self.launcher.close()

    def cleanup(self, keep_work: bool) -> None:
        interrupt.no_stacks_on_sigusr1(self.stacks)
        self.stacks = None
        if not keep_work:
            shutil.rmtree(self.work, ignore_errors=True)
