"""One torchrun launch: start the agents, feed them tasks while they live, watch for a hung
task, hand each result on as it appears, end every process of the launch, record it.

A launch starts with the tasks of its plan and, when it has a *source* (the scheduler's view of
one lane: a world size and GPU slot), asks it for more on every poll and writes them to the
launch's queue (``worker.task_feed``); when the source says no more will come, the queue is
closed and the ranks exit once they ran everything. Without a source the queue is closed at
once (the plan's tasks only). An *early* launch (harness/early_launches.py) starts with no task
and no source, its feed open, before a lane has tasks for it; the lane that takes it over
(``adopt``) feeds it its first tasks.

Every wait is bounded:

* a task running past its case's ``timeout_s`` gets its ranks' Python stacks (SIGUSR1 ->
  faulthandler) attached, every process of the launch is killed, the task is reported as
  ``timeout``; the lane re-launches the launch's unfinished tasks;
* a launch that dies (a rank crashed or exited) blames the task that was running, with each
  rank's log of that task, the unit each rank was in and the exit status;
* a launch that never starts a task within ``startup_timeout_s`` (of its start or, for an early
  launch, of its first tasks) fails its tasks with the torchrun log, rather than looping;
* a launch whose agents fail before any task started (a rank that could not join its process
  group) hands its tasks to a new launch, once: a transient start failure costs a start, not a
  batch of crashed cases; a second one in a row crashes them, each naming both.

However a launch ends (normal exit, timeout, crash, Ctrl-C / SIGTERM, :meth:`Launcher.stop`),
every process it started is killed before the next one starts: torchrun, its ranks (each in a
session of its own), their async DCP stager processes and simulated nodes all carry the launch's
tag in their environment and are found through ``/proc`` (harness/procs.py), wherever they were
reparented; the record says how many were killed and lists any survivor (an agent forked by the
agent server, harness/agent_server.py, and its forked ranks show the server's environment in
``/proc``: they are found as the agent's process group and descendants). torchrun is tethered to
the harness process (or to the agent server, tethered to it) and each rank to torchrun
(``PR_SET_PDEATHSIG``), so a killed pytest takes its launches with it. On GPU the launch's
processes must also release their GPU memory (bounded wait, ``nvidia-smi``; harness/gpu.py)
before the next launch starts.

No shell is involved: the command is an argv list.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Protocol

from . import bytecode, gpu, inductor_cache, launch_dir, procs
from .fork_agent import PRELOAD_BACKEND_VAR
from .interrupt import Interrupted, deferred
from .tasks import LaunchRecord, Task, TaskResult

# Kept in every launched environment (GPU hosts are shared: NVLink multicast can take them
# down for everyone; see DEVELOPERS.md / the device tool's KINDS.md).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "PYTHONFAULTHANDLER": "1",
            # deterministic cuBLAS (bitwise next-step checks on GPU)
            "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
# On GPU hosts (several launches start at once per GPU slot) DCP's process-async stagers
# rendezvous under a prefix of torchrun's own store instead of a port DCP picks free and binds
# later: another launch took that port first (EADDRINUSE in one rank's stager, the other rank's
# waiting for it until the case timeout; seen on 2x H200). CPU launches keep DCP's default.
CUDA_ENV = {"DCP_USE_PREFIX_STORE": "1"}
POLL_S = 0.1
STACK_GRACE_S = 3.0
KILL_WAIT_S = 15.0  # bounded wait for a launch's killed processes to be gone
GPU_RELEASE_S = 30.0  # bounded wait for their GPU memory to be free again


class TaskSource(Protocol):
    """Where a long-lived launch gets more tasks and leaves its results (the scheduler)."""
    timeout_s: float  # the largest case timeout of any task it may hand out

    def more(self, launch: "Launch") -> list[Task] | None:
        """Tasks to add now ([] for none yet); None once no more will come."""

    def finished(self, results: dict[str, TaskResult]) -> None:
        """Results, as they appear."""


class Launch:
    """One torchrun launch of ``tasks`` (and, with a ``source``, those it feeds while the
    launch lives); see the module docstring."""

    def __init__(self, launcher, tasks: list[Task], world_size: int, env: dict,
                 source: TaskSource | None = None, retry_start: bool = False, *,
                 timeout_s: float | None = None, early: bool = False):
        self.l, self.world_size, self.env, self.source = launcher, world_size, env, source
        # a launch whose agents fail before any task started hands its tasks back (once per
        # lane: a transient start failure must not crash a whole batch of cases)
        self.retry_start, self.start_failed = retry_start, False
        self.name, self.d = launcher.new_dir()
        # the largest case timeout it may see; an early launch (started before its lane had
        # tasks: harness/early_launches.py) is told it, its tasks come through the feed
        self.timeout_s = timeout_s or max([t.case.timeout_s for t in tasks]
                                          + [getattr(source, "timeout_s", 0.0)])
        self.plan_path = launch_dir.write_plan(self.d, tasks, launcher.backend, launcher.device,
                                               launcher.collective_timeout_s,
                                               timeout_s=self.timeout_s,
                                               setup_timeout_s=launcher.startup_timeout_s / 3,
                                               stager=world_size in launcher.stager_worlds)
        self.tag = procs.new_tag(self.name)
        self.by_name = {t.name: t for t in tasks}
        self.agents: list[subprocess.Popen] = []
        self.delivered: dict[str, TaskResult] = {}  # results handed to the source
        self.fed, self.closed = 0, source is None and not early
        self.early = "unused" if early else ""  # "" | "unused" | "used" (LaunchRecord.early)
        self.t_start = self.t_tasks = None  # agents started; first tasks given (start-up bound)
        self.t_watched = None  # when the agents exited (or the watch ended)
        self.tmp: str | None = None  # the launch's TMPDIR, removed with its processes
        if self.closed:
            launch_dir.close_feed(self.d, 0)

    def unfinished(self) -> list[Task]:
        """Tasks of this launch without a result (to run again in a new launch)."""
        return [t for n, t in self.by_name.items() if n not in self.delivered]

    def _deliver(self, results: dict[str, TaskResult]) -> None:
        new = {n: r for n, r in results.items() if n not in self.delivered}
        self.delivered.update(new)
        if new and self.source is not None:
            self.source.finished(new)

    def _pump(self) -> None:
        """Hand on new results; feed the ranks what the source has for them."""
        names = launch_dir.result_names(self.d) - set(self.delivered)
        if names:
            self._deliver(launch_dir.collect(self.d, self.name, self.by_name, names))
        if self.closed:
            return
        more = self.source.more(self)
        if more is None:
            launch_dir.close_feed(self.d, self.fed)
            self.closed = True
        elif more:
            self.fed += 1
            self.by_name.update((t.name, t) for t in more)
            launch_dir.feed(self.d, self.fed, more)

    def start(self) -> None:
        """Start the agents (``run`` does, if this was not called before)."""
        self.t_start = time.time()
        self.tmp = tempfile.mkdtemp(prefix=f"harness-{self.name}-", dir=scratch_parent())
        env = _env(self)
        with open(self.d / "torchrun.log", "w") as out:
            for argv in self.l.commands(self.plan_path, self.world_size, self.name):
                # forked by the launcher's agent server when it can (harness/agent_server.py)
                agent = self.l.agent_servers.start_agent(argv, env, str(self.d), out) \
                    if self.l.agent_servers else None
                self.agents.append(agent or subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                    start_new_session=True, cwd=str(self.d)))

    def adopt(self, source: TaskSource, tasks: list[Task], retry_start: bool) -> None:
        """An early launch becomes a lane's launch: ``tasks`` go through its feed."""
        self.source, self.retry_start, self.early = source, retry_start, "used"
        self.by_name.update((t.name, t) for t in tasks)
        self.fed += 1
        launch_dir.feed(self.d, self.fed, tasks)
        self.t_tasks = time.time()

    def discard(self) -> None:
        """End an early launch no lane took (every process killed, bounded), recorded."""
        with deferred():
            cleanup = end_processes(self)
        _record(self, self.t_start or time.time(), time.time(), False, cleanup, {})

    def run(self) -> dict[str, TaskResult]:
        hung, timed_out, stopped = None, False, False
        try:
            if self.t_start is None:
                self.start()
            self.t_tasks = self.t_tasks or self.t_start
            hung, timed_out = self._watch()
            self.t_watched = time.time()
        except BaseException:  # Ctrl-C / SIGTERM / stop(): record the launch, then re-raise
            stopped = True
            raise
        finally:
            start = self.t_start or time.time()
            with deferred():  # a second Ctrl-C must not cut the clean-up short
                cleanup = end_processes(self)
                if stopped:  # keep the tasks that finished before the stop
                    done = launch_dir.collect(self.d, self.name, self.by_name)
                    with self.l._lock:
                        self.l.salvaged.update(done)
                    self._deliver(done)
                    _record(self, start, time.time(), False, cleanup, done, interrupted=True)
        end = time.time()
        results = _results(self, start, end, hung, timed_out)
        if self.start_failed and self.retry_start:  # nothing delivered: the lane runs them again
            _record(self, start, end, timed_out, cleanup, {}, start_failed="retried")
            return {}
        self._deliver(results)
        _record(self, start, end, timed_out, cleanup, results,
                start_failed="reported" if self.start_failed else "")
        return results

    def _watch(self) -> tuple[str | None, bool]:
        """Poll until the agents exit, a task runs past its timeout (its stacks are dumped
        first), or nothing starts within ``startup_timeout_s``. Returns (hung task, timed out).
        Raises :class:`Interrupted` when the launcher was stopped."""
        while None in (states := [p.poll() for p in self.agents]):
            if any(rc not in (None, 0) for rc in states):
                break  # one agent failed: the others would wait for it forever
            if self.l._stop.is_set():
                raise Interrupted("the run is being stopped")
            time.sleep(POLL_S)
            self._pump()
            current = launch_dir.current(self.d)
            if current is None:
                if not self.delivered and \
                        time.time() - self.t_tasks > self.l.startup_timeout_s:
                    return None, True
                continue
            task_name, t0, pids = current
            task = self.by_name.get(task_name)
            if task and time.time() - t0 > task.case.timeout_s:
                _dump_stacks(self.d, pids)
                return task_name, True
        return None, False


# a Unix socket's path has at most 107 bytes; multiprocessing puts its listeners at
# $TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX (32 more) and the launch's own dir adds 22
SOCKET_PATH_MAX, SCRATCH_DEPTH = 107, 32 + 22 + 8


def _dump_stacks(d: Path, pids: list[int]) -> None:
    """SIGUSR1 -> each rank's faulthandler writes its threads' stacks; wait until every rank's
    stack file grew, at most ``STACK_GRACE_S``."""
    files = list((d / "stacks").glob("rank*.txt"))
    before = {f: f.stat().st_size for f in files}
    procs.signal_all(pids, signal.SIGUSR1)
    deadline = time.monotonic() + STACK_GRACE_S
    while time.monotonic() < deadline:
        time.sleep(0.1)
        if files and all(f.stat().st_size > n for f, n in before.items()):
            time.sleep(0.2)  # let the last lines land
            return


def scratch_parent() -> str:
    """Where a launch's temporary directory goes: the temporary directory when sockets made
    in it fit a Unix socket's path (DCP's process stager failed "AF_UNIX path too long" under
    a deep TMPDIR), else /tmp."""
    parent = tempfile.gettempdir()
    if len(os.fsencode(parent)) + SCRATCH_DEPTH > SOCKET_PATH_MAX and os.access("/tmp", os.W_OK):
        return "/tmp"
    return parent


def end_processes(launch: Launch) -> dict:
    """Kill every process of the launch and wait until they are gone (bounded); on GPU,
    wait until they released their GPU memory. Returns what the launch record keeps."""
    for p in launch.agents:  # srun first gets a SIGTERM to forward to the remote nodes
        if launch.l.node_launcher:
            procs.terminate_gently(p)
    agents = {p.pid for p in launch.agents}
    # the agents that still run are killed by pid too: one the agent server forked a moment
    # ago may not lead its group yet (its setsid comes first thing, but after the fork)
    running = {p.pid for p in launch.agents if p.poll() is None}
    # the ranks this launch's progress files name (pids checked against the plan: a stale
    # pid may belong to someone else by now) and everything below the agents
    ranks = [pid for pid in launch_dir.progress_pids(launch.d)
             if str(launch.plan_path) in procs.cmdline(pid) or _in_agent_group(agents, pid)]
    extra = set(ranks) | procs.descendants(list(agents)) | running
    for pid in agents:
        procs.kill_group(pid)
    killed, leaked = procs.kill_tagged(launch.tag, extra, timeout_s=KILL_WAIT_S)
    for p in launch.agents:
        procs.reap(p)
    held = []
    if launch.l.device == "cuda":
        held = gpu.wait_released(set(killed) | extra | agents, timeout_s=GPU_RELEASE_S)
    if launch.tmp is not None:  # torchrun's log dir, multiprocessing's pymp-*, stagers' files
        shutil.rmtree(launch.tmp, ignore_errors=True)
    return dict(killed=len(killed), leaked=leaked, gpu_held=held)


def _in_agent_group(agents: set[int], pid: int) -> bool:
    """A rank forked by an agent that the agent server forked has the server's command line;
    it is known by its process group: its agent's (a group id is not reused while it has a
    member)."""
    p = procs.info(pid)
    return p is not None and p.pgid in agents


def _record(launch: Launch, start, end, timed_out, cleanup, results, interrupted=False,
            start_failed="") -> None:
    starts = [r.started for r in results.values() if r.started]
    ends = [r.ended for r in results.values() if r.ended]
    overhead = ((min(starts) - start) + (end - max(ends))) if starts else end - start
    launch.l.add_record(LaunchRecord(
        launch.name, launch.world_size, len(results), end - start, overhead,
        procs.returncode(launch.agents), timed_out, launch.env.get("CUDA_VISIBLE_DEVICES", ""),
        interrupted=interrupted, start_failed=start_failed, early=launch.early,
        phases=launch_dir.phases(launch.d, start, end, starts, ends, launch.t_watched),
        started=start, ended=end, **cleanup))


def _units(by_rank: dict) -> str:
    return ", ".join(f"rank {r} in {u}" for r, u in sorted(by_rank.items())) or "unknown"


def _env(launch: Launch) -> dict:
    """The launch's environment: ours, the slot's, the safe settings and the launch's tag."""
    full = {**os.environ, **launch.l.extra_env, **launch.env, **SAFE_ENV,
            **(CUDA_ENV if launch.l.device == "cuda" else {}), procs.TAG_VAR: launch.tag}
    # every temporary file of the launch's processes goes in a directory of its own, removed
    # once they are gone: torchrun makes a log dir per launch and ranks that end with os._exit
    # (or are killed) never run multiprocessing's clean-up of its pymp-* dirs -- a thousand of
    # each were left in /tmp after a day of runs
    full.update(TMPDIR=launch.tmp, TEMP=launch.tmp, TMP=launch.tmp)
    repo = str(Path(__file__).resolve().parent.parent)
    # the harness, then the directory pytest runs in (on the pytest process's sys.path with
    # ``python -m pytest``): a model factory importable there is importable in the workers
    full["PYTHONPATH"] = os.pathsep.join(
        p for p in (repo, os.getcwd(), full.get("PYTHONPATH")) if p)
    full.update(bytecode.worker_env(full))
    full.update(inductor_cache.worker_env(full))
    if launch.l.fork_ranks:  # the agent imports the backend's library before forking ranks
        full[PRELOAD_BACKEND_VAR] = launch.l.backend
    return full


def _results(launch: Launch, start, end, hung, timed_out) -> dict:
    """Each task's result: from the ranks' result files, else timeout / crash."""
    d, name = launch.d, launch.name
    results = launch_dir.collect(d, name, launch.by_name)
    returncode = procs.returncode(launch.agents)
    current = launch_dir.current(d)  # (task, its start, pids) of the task left running
    task_start = current[1] if current else start
    if hung is not None:
        results[hung] = TaskResult(
            name=hung, status="timeout", launch=name, seconds=end - task_start,
            errors={-1: f"timed out after {launch.by_name[hung].case.timeout_s:.0f}s "
                        f"(case timeout_s); units running: "
                        f"{_units(launch_dir.units(d, hung))}; ranks' Python stacks below"},
            stacks=launch_dir.read_stacks(d), logs=launch_dir.task_logs(d, hung))
    elif len(results) < len(launch.by_name):
        started = current[0] if current else None
        log = launch_dir.tail(d / "torchrun.log")
        if started is not None:
            results[started] = TaskResult(
                name=started, status="crash", launch=name, seconds=end - task_start,
                errors={-1: f"the launch died while this task ran (torchrun exit status "
                            f"{returncode}): "
                            f"{launch_dir.crash_account(d, launch.by_name[started])}; "
                            f"per-rank logs below\n{log}"},
                logs=launch_dir.task_logs(d, started))
        elif not results:
            # a start that timed out is not retried (it would cost the start-up bound again)
            launch.start_failed = not timed_out
            why = "did not start a task within %.0fs" % launch.l.startup_timeout_s \
                if timed_out else f"exited with status {returncode} before any task started"
            if launch.start_failed and not launch.retry_start:
                why += " (twice in a row: the launch before it failed to start as well)"
            for t in launch.by_name.values():
                results[t.name] = TaskResult(
                    name=t.name, status="crash", launch=name,
                    errors={-1: f"torchrun {why}\n{log}"}, logs=launch_dir.all_logs(d),
                    stacks=launch_dir.read_stacks(d))
    return results
