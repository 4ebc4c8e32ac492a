"""One torchrun launch: start the agents, feed them the lane's tasks while they live (the
launch's queue, ``worker.task_feed``), watch for a hung task, hand each result on as it
appears, end every process, record it. Everything it needs is handed to it (settings, dir,
argv, feed, the run's stop flag, where its record goes); it calls into nothing above it.

Every wait is bounded: a task past its case's ``timeout_s`` gets its ranks' stacks (SIGUSR1)
and the launch is killed (``timeout``; the lane re-launches the rest), as is a teardown past
it after the last result; a launch that dies blames the running task with each rank's log,
unit and exit status; no task started within ``startup_timeout_s`` fails the tasks with
torchrun's log; agents failing before any task hand their tasks to a new launch once. However
it ends, every process it started is
killed before the next one starts (``ending.py``: found by the launch's tag through ``/proc``,
wherever reparented; on GPU their memory must be released). torchrun is tethered to pytest and
each rank to torchrun (``PR_SET_PDEATHSIG``). No shell: the command is an argv list.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness.launch import ending, launch_dir, procs, scratch
from harness.speed import bytecode_cache, inductor_cache, layers
from harness.launch.interrupt import Interrupted, deferred
from harness.launch.tasks import LaunchRecord, Task, TaskResult

# Kept in every launched environment (GPU hosts are shared: NVLink multicast can take them
# down for everyone; see DEVELOPERS.md / the device tool's KINDS.md); deterministic cuBLAS
# (bitwise next-step checks on GPU).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "PYTHONFAULTHANDLER": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
# On GPU hosts (launches start at once per GPU slot) DCP's process-async stagers rendezvous
# under a prefix of torchrun's store, not a port DCP picks free and binds later, which another
# launch could take first (EADDRINUSE; its peer waits out the case). CPU keeps DCP's default.
CUDA_ENV = {"DCP_USE_PREFIX_STORE": "1"}
# glibc's malloc keeps freed large blocks (else each temporary page-faults); caller's MALLOC_* win
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 32)}
POLL_S = 0.1
TORCHRUN = "torch.distributed.run"  # the module a fresh agent runs
# a Unix socket's path has at most 107 bytes; multiprocessing's listeners add 32
# ($TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX), the launch's dir up to 31 (scratch.py)
SOCKET_PATH_MAX, SCRATCH_DEPTH = 107, 32 + 31 + 8


@dataclass(frozen=True)
class LaunchSettings:
    """What every launch of a launcher shares."""
    backend: str
    device: str
    collective_timeout_s: float
    startup_timeout_s: float
    extra_env: dict = field(default_factory=dict)
    gentle_stop: bool = False  # SIGTERM the agents first (srun forwards it to remote nodes)
    stager: bool = False  # may run an async_process save: the ranks start DCP's stager first
    rank_server: object = None  # rank_server.RankServer: agents forked from it, else fresh


class Launch:
    """One torchrun launch of ``tasks`` and those ``feed`` hands it while it lives."""

    def __init__(self, settings: LaunchSettings, name: str, d: Path,
                 argvs: Callable[[Path], list[list[str]]], tasks: list[Task], world_size: int,
                 env: dict, feed, *, stop: threading.Event,
                 on_record: Callable[[LaunchRecord], None], retry_start: bool = False):
        self.settings, self.name, self.d = settings, name, d
        self.world_size, self.env, self.feed = world_size, env, feed
        self.stop, self.on_record = stop, on_record
        # a launch whose agents fail before any task started hands its tasks back (once per
        # lane: a transient start failure must not crash a whole batch of cases)
        self.retry_start, self.start_failed = retry_start, False
        # the largest case timeout it may see (fed tasks included)
        self.timeout_s = max([t.case.timeout_s for t in tasks] + [feed.timeout_s])
        self.plan_path = launch_dir.write_plan(
            d, tasks, settings.backend, settings.device, settings.collective_timeout_s,
            timeout_s=self.timeout_s, setup_timeout_s=settings.startup_timeout_s / 3,
            stager=settings.stager)
        self.argvs = argvs(self.plan_path)
        self.tag = procs.new_tag(name)
        self.by_name = {t.name: t for t in tasks}
        self.agents: list[subprocess.Popen] = []
        self.agent_ids: dict[int, int] = {}  # pid -> start time (procs.identities), at start
        self.delivered: dict[str, TaskResult] = {}  # results handed to the feed
        self.fed, self.closed = 0, False
        self.t_start = None  # agents started (the start-up bound counts from here)
        self.tmp: str | None = None  # the launch's TMPDIR, removed with its processes

    def unfinished(self) -> list[Task]:
        """Tasks of this launch without a result (to run again in a new launch)."""
        return [t for n, t in self.by_name.items() if n not in self.delivered]

    def _deliver(self, results: dict[str, TaskResult]) -> None:
        new = {n: r for n, r in results.items() if n not in self.delivered}
        self.delivered.update(new)
        if new:
            self.feed.finished(new)

    def _pump(self) -> None:
        """Hand on new results; write what the feed has for the ranks to their queue."""
        names = launch_dir.result_names(self.d) - set(self.delivered)
        if names:
            self._deliver(launch_dir.collect(self.d, self.name, self.by_name, names))
        if self.closed:
            return
        more = self.feed.poll()
        if more is None:
            launch_dir.close_feed(self.d, self.fed)
            self.closed = True
        elif more:
            self.fed += 1
            self.by_name.update((t.name, t) for t in more)
            launch_dir.feed(self.d, self.fed, more)

    def _start(self) -> None:
        self.t_start = time.time()
        self.tmp = tempfile.mkdtemp(prefix=scratch.prefix(self.name), dir=scratch_parent())
        env, log, s = self._env(), self.d / "torchrun.log", self.settings
        with open(log, "w") as out:
            for argv in self.argvs:
                agent = s.rank_server.start_agent(argv, env, log, self.d, s.startup_timeout_s) \
                    if s.rank_server is not None else popen_agent(argv, env, out, self.d)
                self.agents.append(agent)
                if (p := procs.info(agent.pid)) is not None:  # a zombie too: its pid is held
                    self.agent_ids[agent.pid] = p.start

    def run(self) -> dict[str, TaskResult]:
        hung, timed_out, stopped = None, False, False
        try:
            self._start()
            hung, timed_out = self._watch()
        except BaseException:  # Ctrl-C / SIGTERM / the run's stop: record, then re-raise
            stopped = True
            raise
        finally:
            start = self.t_start or time.time()
            with deferred():  # a second Ctrl-C must not cut the clean-up short
                cleanup = ending.end_processes(self)
                if stopped:  # keep the tasks that finished before the stop
                    done = launch_dir.collect(self.d, self.name, self.by_name)
                    self._deliver(done)
                    ending.record(self, start, time.time(), False, cleanup, done,
                                  interrupted=True)
        end = time.time()
        results = ending.results(self, start, end, hung, timed_out)
        if self.start_failed and self.retry_start:  # nothing delivered: the lane runs them again
            ending.record(self, start, end, timed_out, cleanup, {}, start_failed="retried")
            return {}
        self._deliver(results)
        ending.record(self, start, end, timed_out, cleanup, results,
                      start_failed="reported" if self.start_failed else "")
        return results

    def _watch(self) -> tuple[str | None, bool]:
        """Poll until the agents exit or a bound of the module's passes (a hung task's stacks
        dumped first). Returns (hung task, timed out); :class:`Interrupted` on the run's stop."""
        done_at = None
        while None in (states := [p.poll() for p in self.agents]):
            if any(rc not in (None, 0) for rc in states):
                break  # one agent failed: the others would wait for it forever
            if self.stop.is_set():
                raise Interrupted("the run is being stopped")
            time.sleep(POLL_S)
            self._pump()
            current = launch_dir.current(self.d)
            if current is None:
                if not self.delivered and \
                        time.time() - self.t_start > self.settings.startup_timeout_s:
                    return None, True
                if self.closed and not self.unfinished():  # the ranks' teardown
                    done_at = done_at or time.time()
                    if time.time() - done_at > self.timeout_s:
                        return None, True
                continue
            task_name, t0, pids = current
            task = self.by_name.get(task_name)
            if task and time.time() - t0 > task.case.timeout_s:
                ending.dump_stacks(self.d, pids)
                return task_name, True
        return None, False

    def _env(self) -> dict:
        """The run's environment (:func:`run_env`), the slot's, the launch's tag and TMPDIR."""
        s = self.settings
        full = {**run_env(s.device, s.extra_env), **self.env, **SAFE_ENV, procs.TAG_VAR: self.tag}
        # every temporary file of the launch's processes goes in a directory of its own,
        # removed once they are gone: torchrun makes a log dir per launch and ranks that end
        # with os._exit (or are killed) never run multiprocessing's clean-up of its pymp-*
        # dirs -- a thousand of each were left in /tmp after a day of runs
        full.update(TMPDIR=self.tmp, TEMP=self.tmp, TMP=self.tmp)
        return full


def popen_agent(argv: list[str], env: dict, out, cwd: Path) -> subprocess.Popen:
    """A fresh torchrun agent: ``argv`` in a session of its own, its output in ``out``."""
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, cwd=str(cwd))


def run_env(device: str, extra_env: dict) -> dict:
    """What every launch's environment holds (the rank server's too): ours, the caller's, the
    safe settings, the harness on the path and the compile caches (Inductor's, bytecode)."""
    full = {**MALLOC_ENV, **os.environ, **extra_env, **SAFE_ENV,
            **(CUDA_ENV if device == "cuda" else {})}
    repo = str(Path(__file__).resolve().parents[2])
    # the harness, then the directory pytest runs in (on the pytest process's sys.path with
    # ``python -m pytest``): a model factory importable there is importable in the workers
    full["PYTHONPATH"] = os.pathsep.join(
        p for p in (repo, os.getcwd(), full.get("PYTHONPATH")) if p)
    if "inductor_cache" in layers.from_env(full):
        full.update(inductor_cache.worker_env(full, extra_env))
    return bytecode_cache.launch_env(full)  # where the layer is on and applies


def scratch_parent() -> str:
    """Where a launch's temporary directory goes: the temporary directory when sockets made
    in it fit a Unix socket's path (DCP's process stager failed "AF_UNIX path too long" under
    a deep TMPDIR), else /tmp."""
    parent = tempfile.gettempdir()
    if len(os.fsencode(parent)) + SCRATCH_DEPTH > SOCKET_PATH_MAX and os.access("/tmp", os.W_OK):
        return "/tmp"
    return parent
