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

No shell is involved: the command is an argv list.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .matrix import Case

# Kept in every launched environment (GPU hosts are shared: NVLink multicast can take them
# down for everyone; see DEVELOPERS.md / the device tool's KINDS.md).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "PYTHONFAULTHANDLER": "1",
            # deterministic cuBLAS (bitwise next-step checks on GPU)
            "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
POLL_S = 0.2
STACK_GRACE_S = 3.0
LOG_TAIL = 6000


@dataclass
class Task:
    name: str  # unique: "<case key>.<phase>"
    case: Case
    phase: str  # "train" | "reshard"
    ckpt_dir: Path

    @property
    def world_size(self) -> int:
        return self.case.world_sizes[0 if self.phase == "train" else 1]

    def to_json(self) -> dict:
        return dict(name=self.name, case=self.case.to_json(), phase=self.phase,
                    ckpt_dir=str(self.ckpt_dir))


@dataclass
class TaskResult:
    name: str
    status: str  # "ok" (ran; rows say pass/fail) | "error" | "timeout" | "crash"
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


class Launcher:
    def __init__(self, root: Path, backend: str, device: str, *, collective_timeout_s=60.0,
                 startup_timeout_s=180.0, env: dict | None = None, python: str = sys.executable,
                 gpus: list[str] | None = None, nnodes: int = 1, rdzv_endpoint: str | None = None,
                 node_launcher: list[str] | None = None):
        self.root = Path(root)
        self.backend, self.device = backend, device
        self.gpus = list(gpus or [])  # visible GPU ids (respecting CUDA_VISIBLE_DEVICES)
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

    # ------------------------------------------------------------------------------------
    def slots(self, world_size: int) -> list[dict]:
        """GPU slot packing: with G visible GPUs, G // world_size launches run at once, each on
        its own CUDA_VISIBLE_DEVICES slice. One slot (no env) on CPU."""
        if self.device != "cuda" or not self.gpus:
            return [{}]
        n = len(self.gpus) // world_size
        return [{"CUDA_VISIBLE_DEVICES": ",".join(self.gpus[i * world_size:(i + 1) * world_size])}
                for i in range(max(n, 1))]

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
        for th in threads:
            th.join()
        if errors:
            raise errors[0]
        return results

    def _run_chunk(self, tasks: list[Task], world_size: int, env: dict) -> dict:
        results: dict[str, TaskResult] = {}
        remaining = list(tasks)
        while remaining:
            got = self._launch(remaining, world_size, env)
            if not got:  # cannot happen by construction; never loop forever
                raise RuntimeError("launch produced no result")
            results.update(got)
            remaining = [t for t in remaining if t.name not in results]
        return results

    # ------------------------------------------------------------------------------------
    def _new_dir(self) -> tuple[str, Path]:
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
        torchrun = [self.python, "-m", "torch.distributed.run"]
        if self.nnodes == 1:
            return [torchrun + ["--standalone", f"--nproc-per-node={world_size}"] + worker]
        if world_size % self.nnodes:
            raise ValueError(f"world size {world_size} does not split over {self.nnodes} nodes")
        endpoint = self.rdzv_endpoint or f"127.0.0.1:{_free_port()}"
        agent = torchrun + [f"--nnodes={self.nnodes}",
                            f"--nproc-per-node={world_size // self.nnodes}",
                            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                            f"--rdzv-id={launch}-{os.getpid()}"] + worker
        if self.node_launcher:
            return [self.node_launcher + agent]
        return [agent for _ in range(self.nnodes)]

    def _launch(self, tasks: list[Task], world_size: int, env: dict) -> dict[str, TaskResult]:
        name, d = self._new_dir()
        case_timeout = max(t.case.timeout_s for t in tasks)
        plan = dict(dir=str(d), backend=self.backend, device=self.device,
                    collective_timeout_s=min(self.collective_timeout_s, case_timeout / 2),
                    control_timeout_s=case_timeout, health_timeout_s=15.0,
                    tasks=[t.to_json() for t in tasks])
        plan_path = d / "plan.json"
        plan_path.write_text(json.dumps(plan, indent=1))
        full_env = {**os.environ, **self.extra_env, **env, **SAFE_ENV}
        repo = str(Path(__file__).resolve().parent.parent)
        full_env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, full_env.get("PYTHONPATH")) if p)
        start = time.time()
        procs = []
        with open(d / "torchrun.log", "w") as out:
            for argv in self.commands(plan_path, world_size, name):
                procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                              env=full_env, start_new_session=True, cwd=str(d)))
        by_name = {t.name: t for t in tasks}
        hung, timed_out = None, False
        try:
            while None in (states := [p.poll() for p in procs]):
                if any(rc not in (None, 0) for rc in states):
                    break  # one agent failed: the others would wait for it forever
                time.sleep(POLL_S)
                current = self._current(d)
                if current is None:
                    if not _results(d) and time.time() - start > self.startup_timeout_s:
                        timed_out = True
                        break
                    continue
                task_name, t0, pids = current
                task = by_name.get(task_name)
                if task and time.time() - t0 > task.case.timeout_s:
                    hung, timed_out = task_name, True
                    _signal_all(pids, signal.SIGUSR1)  # faulthandler stack dump
                    time.sleep(STACK_GRACE_S)
                    break
        finally:
            for p in procs:
                _kill_group(p, gentle=bool(self.node_launcher))
        end = time.time()
        results = self._collect(d, name, by_name)
        returncode = next((p.returncode for p in procs if p.returncode), procs[0].returncode)
        if hung is not None:
            results[hung] = TaskResult(
                name=hung, status="timeout", launch=name, seconds=end - start,
                errors={-1: f"timed out after {by_name[hung].case.timeout_s:.0f}s "
                            f"(case timeout_s); ranks' Python stacks below"},
                stacks=_read_stacks(d), logs=_task_logs(d, hung))
        elif len(results) < len(tasks):
            current = self._current(d)
            started = current[0] if current else None
            if started is not None:
                results[started] = TaskResult(
                    name=started, status="crash", launch=name, seconds=end - start,
                    errors={-1: f"the launch died while this task ran (torchrun exit status "
                                f"{returncode}); per-rank logs below\n{_tail(d / 'torchrun.log')}"},
                    logs=_task_logs(d, started))
            elif not results:
                why = "did not start a task within %.0fs" % self.startup_timeout_s if timed_out \
                    else f"exited with status {returncode} before any task started"
                for t in tasks:
                    results[t.name] = TaskResult(
                        name=t.name, status="crash", launch=name,
                        errors={-1: f"torchrun {why}\n{_tail(d / 'torchrun.log')}"},
                        logs=_all_logs(d))
        starts = [r.started for r in results.values() if r.started]
        ends = [r.ended for r in results.values() if r.ended]
        overhead = ((min(starts) - start) + (end - max(ends))) if starts else end - start
        with self._lock:
            self.records.append(LaunchRecord(name, world_size, len(results), end - start,
                                             overhead, returncode, timed_out,
                                             env.get("CUDA_VISIBLE_DEVICES", "")))
        return results

    # ------------------------------------------------------------------------------------
    @staticmethod
    def _current(d: Path):
        """(task, start time, pids) of the task the ranks are running, or None."""
        progress = []
        for p in (d / "progress").glob("rank*.json"):
            try:
                progress.append(json.loads(p.read_text()))
            except (OSError, json.JSONDecodeError):
                continue
        done = {p.stem for p in (d / "results").glob("*.json")}
        running = [p for p in progress if p.get("task") and p["task"] not in done]
        if not running:
            return None
        first = min(running, key=lambda p: p["t"])
        return first["task"], first["t"], [p["pid"] for p in progress if p.get("pid")]

    @staticmethod
    def _collect(d: Path, launch: str, by_name: dict) -> dict[str, TaskResult]:
        out = {}
        for name, r in _results(d).items():
            if name not in by_name:
                continue
            errors = {int(k): v for k, v in r["errors"].items()}
            out[name] = TaskResult(name=name, status="error" if errors else "ok", rows=r["rows"],
                                   errors=errors, seconds=r["seconds"], launch=launch,
                                   logs=_task_logs(d, name) if errors else {},
                                   started=r.get("started", 0.0), ended=r.get("ended", 0.0))
        return out


def _results(d: Path) -> dict:
    out = {}
    for p in (d / "results").glob("*.json"):
        try:
            out[p.stem] = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
    return out


def _signal_all(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_group(proc: subprocess.Popen, gentle: bool = False) -> None:
    """Kill torchrun, its workers and anything they spawned (async DCP helpers). ``gentle``:
    SIGTERM first (srun forwards it to the remote nodes; SIGKILL would orphan them)."""
    if gentle and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL'd processes reap quickly
        pass


def _tail(path: Path, n: int = LOG_TAIL) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-n:]


def _read_stacks(d: Path) -> str:
    parts = []
    for p in sorted((d / "stacks").glob("rank*.txt")):
        text = p.read_text(errors="replace").strip()
        if text:
            parts.append(f"--- {p.stem} ---\n{text[-LOG_TAIL:]}")
    return "\n".join(parts)


def _task_logs(d: Path, task: str) -> dict:
    """Each rank's log lines between this task's start and end markers."""
    out = {}
    start, end = f"=== task {task} start", f"=== task {task} end"
    for p in sorted((d / "logs").glob("rank*.log")):
        text = p.read_text(errors="replace")
        i = text.rfind(start)
        if i < 0:
            continue
        j = text.find(end, i)
        section = text[i:] if j < 0 else text[i:j + len(end)]
        out[int(p.stem[4:])] = section[-LOG_TAIL:]
    return out


def _all_logs(d: Path) -> dict:
    return {int(p.stem[4:]): _tail(p) for p in sorted((d / "logs").glob("rank*.log"))}
