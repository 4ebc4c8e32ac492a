"""Run a batch of tasks (case phases of one world size) under real torchrun.

One launch runs many tasks in one process group (process start costs seconds). Every wait is
bounded:

* a task running past its case's ``timeout_s`` gets its ranks' Python stacks (SIGUSR1 ->
  faulthandler) attached, the whole process group is killed (``start_new_session=True`` +
  ``killpg``), the task is reported as ``timeout`` and the rest of the batch is re-launched;
* a launch that dies (a rank crashed or exited) blames the task that was running, with each
  rank's log of that task and the exit status, and re-launches the rest;
* a launch that never starts a task within ``startup_timeout_s`` fails every task with the
  torchrun log, rather than looping.

However a launch ends (normal exit, timeout, crash, Ctrl-C / SIGTERM, :meth:`Launcher.stop`),
every process it started is killed before the next one starts: torchrun, its ranks (each in a
session of its own), their async DCP stager processes and simulated nodes all carry the launch's
tag in their environment and are found through ``/proc`` (harness/procs.py), wherever they were
reparented; the record says how many were killed and lists any survivor. torchrun is tethered to
this process and each rank to torchrun (``PR_SET_PDEATHSIG``), so a killed pytest takes its
launches with it. On GPU the launch's processes must also release their GPU memory (bounded
wait, ``nvidia-smi``; harness/gpu.py) before the next launch starts.

No shell is involved: the command is an argv list.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import gpu, launch_dir, procs
from .interrupt import Interrupted, deferred
from .tasks import LaunchRecord, Task, TaskResult

__all__ = ["Launcher", "LaunchRecord", "Task", "TaskResult", "SAFE_ENV", "STOP_JOIN_S"]

# Kept in every launched environment (GPU hosts are shared: NVLink multicast can take them
# down for everyone; see DEVELOPERS.md / the device tool's KINDS.md).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "PYTHONFAULTHANDLER": "1",
            # deterministic cuBLAS (bitwise next-step checks on GPU)
            "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
POLL_S = 0.2
STACK_GRACE_S = 3.0
KILL_WAIT_S = 15.0  # bounded wait for a launch's killed processes to be gone
GPU_RELEASE_S = 30.0  # bounded wait for their GPU memory to be free again
STOP_JOIN_S = 60.0  # bounded wait for GPU-slot threads after a stop


class Launcher:
    """Runs batches of tasks, each batch spread over the GPU slots, each slot's share re-launched
    after a timeout or crash until every task has a result. One launch is a :class:`Launch`."""

    def __init__(self, root: Path, backend: str, device: str, *, collective_timeout_s=60.0,
                 startup_timeout_s=180.0, env: dict | None = None, python: str = sys.executable,
                 gpus: list[str] | None = None, nnodes: int = 1, rdzv_endpoint: str | None = None,
                 node_launcher: list[str] | None = None, launches_per_gpu: int = 1):
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
        self.startup_timeout_s = startup_timeout_s
        self.extra_env = dict(env or {})
        self.python = python
        self.records: list[LaunchRecord] = []
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.salvaged: dict[str, TaskResult] = {}  # tasks finished by launches cut short
        self.on_record: list = []  # callbacks(LaunchRecord), called as each launch ends

    def stop(self) -> None:
        """Make every running launch end now (its processes killed) and no new one start."""
        self._stop.set()

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
        results: dict[str, TaskResult] = {}
        remaining = list(tasks)
        while remaining:
            if self._stop.is_set():
                raise Interrupted("the run is being stopped")
            got = Launch(self, remaining, world_size, env).run()
            if not got:  # cannot happen by construction; never loop forever
                raise RuntimeError("launch produced no result")
            results.update(got)
            remaining = [t for t in remaining if t.name not in results]
        return results

    def new_dir(self) -> tuple[str, Path]:
        with self._lock:
            name = f"L{next(self._counter):03d}"
        d = self.root / name
        for sub in ("logs", "stacks", "progress", "results"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        return name, d

    def commands(self, plan_path: Path, world_size: int, launch: str) -> list[list[str]]:
        """The argv lists to start for one launch (no shell)."""
        worker = ["--max-restarts=0", "--monitor-interval=0.5", "-m", "harness.worker",
                  "--plan", str(plan_path)]
        # torchrun, SIGKILLed by the kernel if this process dies (srun is not our child's
        # parent on the remote nodes: no --parent there)
        parent = [] if self.node_launcher else ["--parent", str(os.getpid())]
        torchrun = [self.python, "-m", "harness.tethered", *parent, "torch.distributed.run"]
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


class Launch:
    """One torchrun launch of ``tasks``: start the agents, watch for a hung task, end every
    process of the launch, read the results, record the launch."""

    def __init__(self, launcher: Launcher, tasks: list[Task], world_size: int, env: dict):
        self.l, self.tasks, self.world_size, self.env = launcher, tasks, world_size, env
        self.name, self.d = launcher.new_dir()
        self.plan_path = launch_dir.write_plan(self.d, tasks, launcher.backend, launcher.device,
                                               launcher.collective_timeout_s)
        self.tag = procs.new_tag(self.name)
        self.by_name = {t.name: t for t in tasks}
        self.agents: list[subprocess.Popen] = []

    def _env(self) -> dict:
        full = {**os.environ, **self.l.extra_env, **self.env, **SAFE_ENV, procs.TAG_VAR: self.tag}
        repo = str(Path(__file__).resolve().parent.parent)
        # the harness, then the directory pytest runs in (on the pytest process's sys.path with
        # ``python -m pytest``): a model factory importable there is importable in the workers
        full["PYTHONPATH"] = os.pathsep.join(
            p for p in (repo, os.getcwd(), full.get("PYTHONPATH")) if p)
        return full

    def run(self) -> dict[str, TaskResult]:
        start = time.time()
        hung, timed_out, stopped = None, False, False
        try:
            env = self._env()
            with open(self.d / "torchrun.log", "w") as out:
                for argv in self.l.commands(self.plan_path, self.world_size, self.name):
                    self.agents.append(subprocess.Popen(
                        argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                        start_new_session=True, cwd=str(self.d)))
            hung, timed_out = self._watch(start)
        except BaseException:  # Ctrl-C / SIGTERM / stop(): record the launch, then re-raise
            stopped = True
            raise
        finally:
            with deferred():  # a second Ctrl-C must not cut the clean-up short
                cleanup = self._end_processes()
                if stopped:  # keep the tasks that finished before the stop
                    done = launch_dir.collect(self.d, self.name, self.by_name)
                    with self.l._lock:
                        self.l.salvaged.update(done)
                    self._record(start, time.time(), False, cleanup, done, interrupted=True)
        end = time.time()
        results = self._results(start, end, hung, timed_out)
        self._record(start, end, timed_out, cleanup, results)
        return results

    def _watch(self, start: float) -> tuple[str | None, bool]:
        """Poll until the agents exit, a task runs past its timeout (its stacks are dumped
        first), or nothing starts within ``startup_timeout_s``. Returns (hung task, timed out).
        Raises :class:`Interrupted` when the launcher was stopped."""
        while None in (states := [p.poll() for p in self.agents]):
            if any(rc not in (None, 0) for rc in states):
                break  # one agent failed: the others would wait for it forever
            if self.l._stop.is_set():
                raise Interrupted("the run is being stopped")
            time.sleep(POLL_S)
            current = launch_dir.current(self.d)
            if current is None:
                if not launch_dir.results(self.d) and \
                        time.time() - start > self.l.startup_timeout_s:
                    return None, True
                continue
            task_name, t0, pids = current
            task = self.by_name.get(task_name)
            if task and time.time() - t0 > task.case.timeout_s:
                procs.signal_all(pids, signal.SIGUSR1)  # faulthandler stack dump
                time.sleep(STACK_GRACE_S)
                return task_name, True
        return None, False

    def _end_processes(self) -> dict:
        """Kill every process of the launch and wait until they are gone (bounded); on GPU,
        wait until they released their GPU memory. Returns what the launch record keeps."""
        for p in self.agents:  # srun first gets a SIGTERM to forward to the remote nodes
            if self.l.node_launcher:
                procs.terminate_gently(p)
        # the ranks this launch's progress files name (pids checked against the plan: a stale
        # pid may belong to someone else by now) and everything below the agents
        ranks = [pid for pid in launch_dir.progress_pids(self.d)
                 if str(self.plan_path) in procs.cmdline(pid)]
        extra = set(ranks) | procs.descendants([p.pid for p in self.agents])
        for p in self.agents:
            procs.kill_group(p)
        killed, leaked = procs.kill_tagged(self.tag, extra, timeout_s=KILL_WAIT_S)
        for p in self.agents:
            procs.reap(p)
        held = []
        if self.l.device == "cuda":
            held = gpu.wait_released(set(killed) | extra | {p.pid for p in self.agents},
                                     timeout_s=GPU_RELEASE_S)
        return dict(killed=len(killed), leaked=leaked, gpu_held=held)

    def _results(self, start, end, hung, timed_out) -> dict:
        """Each task's result: from the ranks' result files, else timeout / crash."""
        d, name = self.d, self.name
        results = launch_dir.collect(d, name, self.by_name)
        returncode = procs.returncode(self.agents)
        if hung is not None:
            results[hung] = TaskResult(
                name=hung, status="timeout", launch=name, seconds=end - start,
                errors={-1: f"timed out after {self.by_name[hung].case.timeout_s:.0f}s "
                            f"(case timeout_s); units running: "
                            f"{_units(launch_dir.units(d, hung))}; ranks' Python stacks below"},
                stacks=launch_dir.read_stacks(d), logs=launch_dir.task_logs(d, hung))
        elif len(results) < len(self.by_name):
            current = launch_dir.current(d)
            started = current[0] if current else None
            log = launch_dir.tail(d / "torchrun.log")
            if started is not None:
                results[started] = TaskResult(
                    name=started, status="crash", launch=name, seconds=end - start,
                    errors={-1: f"the launch died while this task ran (torchrun exit status "
                                f"{returncode}): "
                                f"{launch_dir.crash_account(d, self.by_name[started])}; "
                                f"per-rank logs below\n{log}"},
                    logs=launch_dir.task_logs(d, started))
            elif not results:
                why = "did not start a task within %.0fs" % self.l.startup_timeout_s \
                    if timed_out else f"exited with status {returncode} before any task started"
                for t in self.by_name.values():
                    results[t.name] = TaskResult(
                        name=t.name, status="crash", launch=name,
                        errors={-1: f"torchrun {why}\n{log}"}, logs=launch_dir.all_logs(d))
        return results

    def _record(self, start, end, timed_out, cleanup, results, interrupted=False) -> None:
        starts = [r.started for r in results.values() if r.started]
        ends = [r.ended for r in results.values() if r.ended]
        overhead = ((min(starts) - start) + (end - max(ends))) if starts else end - start
        self.l.add_record(LaunchRecord(
            self.name, self.world_size, len(results), end - start, overhead,
            procs.returncode(self.agents), timed_out, self.env.get("CUDA_VISIBLE_DEVICES", ""),
            interrupted=interrupted, phases=launch_dir.phases(self.d, start, end, starts, ends),
            started=start, ended=end, **cleanup))


def _units(by_rank: dict) -> str:
    return ", ".join(f"rank {r} in {u}" for r, u in sorted(by_rank.items())) or "unknown"
