"""What the scheduler hands the launcher and what comes back: a task (one phase of one case),
its result, and the record of one torchrun launch."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.spec.matrix import Case


@dataclass
class Task:
    name: str  # unique: "<case key>.<phase>"
    case: Case
    phase: str  # "train" | "reshard"
    ckpt_dir: Path
    for_reshard: bool = False  # a train task whose checkpoint a reshard task loads
    # train tasks of the cases that differ only in their DCP mode, run by this one's launch
    # after it from its trained run (worker/mode_group.py); ``leader``: a member's first task
    members: list["Task"] = field(default_factory=list)
    leader: str = ""

    @property
    def world_size(self) -> int:
        return self.case.world_sizes[0 if self.phase == "train" else 1]

    def to_json(self, within: set[str] | None = None) -> dict:
        """``within``: the names of the tasks handed to the launch with it -- a member not
        among them (resolved already: cancelled, say) is not the ranks' to run."""
        return dict(name=self.name, case=self.case.to_json(), phase=self.phase,
                    ckpt_dir=str(self.ckpt_dir), for_reshard=self.for_reshard,
                    members=[m.to_json() for m in self.members
                             if within is None or m.name in within])


def as_json(tasks: list[Task]) -> list[dict]:
    """The tasks as a launch's ranks read them (its plan, a queue file): a group's first task
    with only the members handed over with it (``Task.to_json``)."""
    names = {t.name for t in tasks}
    return [t.to_json(within=names) for t in tasks]


@dataclass
class TaskResult:
    name: str
    status: str  # "ok" (ran; rows say pass/fail) | "error" | "timeout" | "crash" | "cancelled"
    rows: list[dict] = field(default_factory=list)
    errors: dict = field(default_factory=dict)  # rank -> traceback
    seconds: float = 0.0
    stacks: str = ""
    logs: dict = field(default_factory=dict)  # rank -> log of this task
    launch: str = ""
    started: float = 0.0
    ended: float = 0.0


@dataclass
class LaunchRecord:
    name: str
    world_size: int
    tasks: int
    wall_s: float
    overhead_s: float  # start-up before the first task + shut-down after the last
    returncode: int | None
    timed_out: bool
    gpus: str = ""  # CUDA_VISIBLE_DEVICES of the launch
    killed: int = 0  # processes of the launch still alive at its end, killed then
    leaked: list = field(default_factory=list)  # "pid cmdline" of processes that survived
    gpu_held: list = field(default_factory=list)  # "pid: N MiB" still held after the launch
    interrupted: bool = False  # stopped by Ctrl-C / SIGTERM / Launcher.stop
    # the agents failed before any task started; "retried": its tasks went to a new launch
    start_failed: str = ""  # "" | "retried" | "reported" (the tasks' results say crash)
    # where the launch's own time went (seconds; python -m harness bench): process start,
    # imports, process group, backend (TE) import, before the first task, after the last
    phases: dict = field(default_factory=dict)
    started: float = 0.0  # wall-clock start / end (overlapping launches: the union is what counts)
    ended: float = 0.0
    fresh_ranks: str = ""  # the run forks ranks but this launch's started fresh: why


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


# a rank's start in its timeline: Python up, imports, CUDA context (``set_device``: ranks sharing
# a GPU make theirs one after another in the driver), process groups, the library under test
RANK_STAMPS = ("main", "imports", "cuda_context", "process_group", "backend")
# a launch's phases before its first task (launch_dir.phases: one per stamp after the first),
# and after its last one
START_PHASES = ("process_start",) + RANK_STAMPS[1:] + ("first_task_wait",)
END_PHASES = ("idle_end", "teardown")


def task_wall(launches: list[dict]) -> float:
    """Seconds in which a task ran in some launch: the union of every launch's interval from
    its first task's start to its last task's end (launch records' phases); the rest of the
    wall is launch overhead, however many launches ran at once."""
    intervals = [(rec["started"] + sum(rec["phases"].get(p, 0) for p in START_PHASES),
                  rec["ended"] - sum(rec["phases"].get(p, 0) for p in END_PHASES))
                 for rec in launches if rec.get("started") and rec.get("phases")
                 and rec.get("tasks")]  # none where its agents failed before a task
    return _union([(a, b) for a, b in intervals if b > a])
