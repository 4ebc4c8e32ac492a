"""Reading one launch's directory (``reports/runs/<run>/launches/L###``): what the ranks wrote
there -- progress (pid, running task), results, timelines, logs and stacks -- and the plan.

    plan.json             tasks, directories, timeouts (written by the launcher)
    queue/NNNNNN.json     tasks fed while the launch lives; queue/closed: no more will come
    progress/rank{R}.json pid, task being run, state     progress/timeline{R}.json  phases
    results/{task}.json   the task's merged rows (rank 0, atomic)
    logs/rank{R}.log      stdout + stderr, "=== task T start/end" markers
    stacks/rank{R}.txt    faulthandler dumps (SIGUSR1, sent to a hung task's ranks)
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

from harness.launch import fork_agent, oom
from harness.launch.tasks import RANK_STAMPS, TaskResult, as_json

LOG_TAIL = 6000


def stager_worlds(cases) -> set[int]:
    """World sizes with async_process cases: their launches start DCP's stager up front."""
    return {c.mesh.world_size for c in cases if c.ax.get("dcp") == "async_process"}


def write_plan(d: Path, tasks: list, backend: str, device: str, collective_timeout_s: float,
               *, idle_timeout_s: float = 3600.0, timeout_s: float | None = None,
               setup_timeout_s: float = 60.0, stager: bool = False) -> Path:
    """``timeout_s``: the largest case timeout the launch may see (fed tasks included).
    ``setup_timeout_s``: how long the ranks' groups may take to form (a launch's set-up, not a
    case's collective, which a loaded host slows: docs/performance.md, "Small costs").
    ``stager``: the launch may run an async_process save (fed tasks included; its own train
    tasks decide too): its ranks start DCP's stager up front."""
    case_timeout = timeout_s or max(t.case.timeout_s for t in tasks)
    collective = min(collective_timeout_s, case_timeout / 2)
    plan = dict(dir=str(d), backend=backend, device=device,
                collective_timeout_s=collective,
                setup_timeout_s=max(setup_timeout_s, collective),
                control_timeout_s=case_timeout, health_timeout_s=15.0,
                idle_timeout_s=idle_timeout_s, tasks=as_json(tasks),
                stager=stager or bool(stager_worlds(t.case for t in tasks if t.phase == "train")))
    plan_path = d / "plan.json"
    plan_path.write_text(json.dumps(plan, indent=1))
    (d / "queue").mkdir(exist_ok=True)
    return plan_path


def feed(d: Path, seq: int, tasks: list) -> None:
    """Queue file ``seq`` (1, 2, ...) with more tasks for the running launch (atomic)."""
    _atomic(d / "queue" / f"{seq:06d}.json", json.dumps(as_json(tasks)))


def close_feed(d: Path, count: int) -> None:
    """No more tasks: the ranks end once they ran the ``count`` queue files' tasks."""
    _atomic(d / "queue" / "closed", str(count))


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def result_names(d: Path) -> set[str]:
    """Tasks with a result file (names only: cheap to poll)."""
    return {p.stem for p in (d / "results").glob("*.json")}


def current(d: Path):
    """(task, start time, pids) of the task the ranks are running, or None."""
    progress = list(read_json((d / "progress").glob("rank*.json")).values())
    done = result_names(d)
    running = [p for p in progress if p.get("task") and p["task"] not in done]
    if not running:
        return None
    first = min(running, key=lambda p: p["t"])
    return first["task"], first["t"], [p["pid"] for p in progress if p.get("pid")]

def collect(d: Path, launch: str, by_name: dict, names=None) -> dict[str, TaskResult]:
    """The results of the launch's tasks (only ``names`` when given)."""
    out = {}
    for name, r in results(d, names).items():
        if name not in by_name:
            continue
        errors = {int(k): v for k, v in r["errors"].items()}
        out[name] = TaskResult(name=name, status="error" if errors else "ok", rows=r["rows"],
                               errors=errors, seconds=r["seconds"], launch=launch,
                               logs=task_logs(d, name) if errors else {},
                               started=r.get("started", 0.0), ended=r.get("ended", 0.0))
    return out


def read_json(paths) -> dict:
    """file stem -> its parsed JSON, for each of ``paths`` that can be read whole (the ranks
    write these files while the launcher reads them: one missing or half-written is left
    out)."""
    out = {}
    for p in paths:
        try:
            out[p.stem] = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
    return out


def results(d: Path, names=None) -> dict:
    return read_json((d / "results").glob("*.json") if names is None else
                     [d / "results" / f"{n}.json" for n in names])


def phases(d: Path, start: float, end: float, starts: list, ends: list) -> dict:
    """Seconds of the launch's phases, from its ranks' timelines (the slowest rank). After the
    last task: ``idle_end`` -- the ranks waiting for a task that never came (a lane's launch
    lives while its feed may still bring one, e.g. a reshard onto its world size) -- then
    ``teardown``, from the feed's close to the launch's end."""
    lines = list(read_json((d / "progress").glob("timeline*.json")).values())
    out = {}
    if lines and all(set(RANK_STAMPS) - {"cuda_context"} <= set(t) for t in lines):
        out["process_start"] = max(t["main"] for t in lines) - start
        for t in lines:
            t.setdefault("cuda_context", t["imports"])  # a CPU rank makes none
        for a, b in zip(RANK_STAMPS, RANK_STAMPS[1:]):
            out[b] = max(t[b] - t[a] for t in lines)
        ready = max(t["backend"] for t in lines)
        if starts:
            out["first_task_wait"] = max(0.0, min(starts) - ready)
    if ends:
        # a rank's tasks_done: its feed closed (a rank killed before it has none)
        closed = max([t["tasks_done"] for t in lines if "tasks_done" in t] + [max(ends)])
        out["idle_end"], out["teardown"] = closed - max(ends), end - closed
    return out


def units(d: Path, task: str) -> dict[int, str]:
    """rank -> the unit (producer / check) each rank last started in ``task``."""
    return {int(stem[4:]): prog["unit"]
            for stem, prog in read_json((d / "progress").glob("rank*.json")).items()
            if prog.get("task") == task and prog.get("unit")}


_EXIT = re.compile(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")


_FORKED_EXIT = re.compile(r"harness\.fork_agent: process (\d+) exitcode: (-?\d+)")


_FRESH = re.compile(re.escape(fork_agent.FRESH_LINE).replace(re.escape("{why}"), "(.*)"))


def started_fresh(d: Path) -> str:
    """Why a launch whose agent was to fork its ranks started them fresh (its log's first
    ``fork_agent.FRESH_LINE``: the rank server broke or its imports failed), else ""."""
    try:
        with open(d / "torchrun.log", errors="replace") as f:
            m = _FRESH.search(f.read(8192))  # said before torchrun starts
    except OSError:
        return ""
    return m.group(1) if m else ""


def rank_exits(torchrun_log: str, pid_ranks: dict[int, int] | None = None) -> dict[int, str]:
    """rank -> how it ended, from torchrun's failure summary ("exitcode: -9" = SIGKILL) and,
    for forked ranks (``fork_agent``), the agent's line per failed pid (``pid_ranks``: its rank)."""
    found = [(int(r), int(c)) for r, c in _EXIT.findall(torchrun_log)]
    found += [(pid_ranks[int(p)], int(c)) for p, c in _FORKED_EXIT.findall(torchrun_log)
              if int(p) in (pid_ranks or {})]
    out = {}
    for rank, code in found:
        if code < 0:
            try:
                out[int(rank)] = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                out[int(rank)] = f"killed by signal {-code}"
        else:
            out[int(rank)] = f"exit code {code}"
    return out


def crash_account(d: Path, task) -> str:
    """One line: which ranks died how, in which unit, and the task's checkpoint directory."""
    exits = rank_exits(tail(d / "torchrun.log", 20000), pid_ranks(d))
    where = units(d, task.name)
    dead = oom.explain(", ".join(f"rank {r} {how}" for r, how in sorted(exits.items()))
                       or "no rank's exit status in torchrun's log")
    during = ", ".join(f"rank {r} in {u}" for r, u in sorted(where.items()))
    return (f"{dead}; units running: {during or 'unknown'}; checkpoint directory "
            f"{task.ckpt_dir}")


def pid_ranks(d: Path) -> dict[int, int]:
    """pid -> rank, from ``progress/rank*.json``."""
    out = {}
    for stem, prog in read_json((d / "progress").glob("rank*.json")).items():
        pid = prog.get("pid") if isinstance(prog, dict) else None
        if isinstance(pid, int):
            out[pid] = int(stem[4:])
    return out


def tail(path: Path, n: int = LOG_TAIL) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-n:]


def read_stacks(d: Path) -> str:
    parts = []
    for p in sorted((d / "stacks").glob("rank*.txt")):
        text = p.read_text(errors="replace").strip()
        if text:
            parts.append(f"--- {p.stem} ---\n{text[-LOG_TAIL:]}")
    return "\n".join(parts)


def task_logs(d: Path, task: str) -> dict:
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


def all_logs(d: Path) -> dict:
    return {int(p.stem[4:]): tail(p) for p in sorted((d / "logs").glob("rank*.log"))}
