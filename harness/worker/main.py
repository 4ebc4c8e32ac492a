"""Per-rank entry point: one process group, many cases.

The launcher writes a plan (JSON: tasks, directories, timeouts) and starts ``python -m
torch.distributed.run ... -m harness.worker --plan PLAN``; its tasks are the plan's and those
the launcher feeds while the launch lives (``worker.task_feed``). For each task this:

1. writes ``progress/rank{R}.json`` (pid, task, start time): the watchdog's running case;
2. runs the phase (``worker.runner``: producers and checks in dependency order) into rows;
3. agrees on the outcome over a gloo control group (bounded): a rank's failure fails it on all;
4. rank 0 writes ``results/{task}.json`` atomically (tmp + os.replace).

If the main process group may be out of step after an error (a rank raised between
collectives), a bounded health check decides whether to go on; if it fails every rank exits and
the launcher re-launches the remaining tasks. Errors inside a producer or check are result rows
(the runner isolates them); ``errors`` are only those outside any unit.

SIGUSR1 dumps all threads' Python stacks to ``stacks/rank{R}.txt`` (faulthandler): the launcher
sends it to a hung case's ranks before killing them.

Each rank is tethered to its torchrun agent (``PR_SET_PDEATHSIG``, worker/tether.py): when the
agent dies -- killed by the launcher, or by the kernel because pytest died -- the rank is
SIGKILLed too instead of computing on, reparented to init, holding its GPU memory. A rank's async
DCP stager (spawned, so not tethered: its creating thread is short-lived) exits when the pipe to
its dead rank closes, and the launcher kills whatever is left by its tag.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

_T_MAIN = time.time()  # this module's import: the worker's Python is up (benchmark timeline)
EXIT_PG_BROKEN = 17  # every rank exits with this when the main group cannot be trusted
# set by the launcher where a launch's process groups are gloo on GPUs (ranks sharing them, or
# a phase of a case whose other phase shares: harness/launch/placement.py): rank r runs on GPU
# r mod G, the only GPU it sees
PG_BACKEND_VAR = "HARNESS_PG_BACKEND"
# set by the launcher where launches of several world sizes share a host's cores
# (harness/launch/placement.py cpu_priority): the rank's nice value, inherited by its stager
NICE_VAR = "HARNESS_NICE"


@dataclass
class Context:
    rank: int
    world_size: int
    local_rank: int
    device: object
    device_type: str
    control: object  # gloo group for agreement between units only, never inside one
    exchange: object  # gloo group for the harness's own data inside units (gathers, flags)
    async_group: object  # gloo group for async DCP saves' background coordination
    backend: object
    meshes: dict = field(default_factory=dict)
    on_unit: object = None  # callback(unit): the runner names each unit as it starts

    def unit_starts(self, unit: str) -> None:
        if self.on_unit is not None:
            self.on_unit(unit)

    def mesh(self, spec, names: dict | None = None):
        """One DeviceMesh per (mesh spec, dim names) for the whole launch (process groups are
        costly); ``names`` renames the dims for backends that look them up by name."""
        key = (spec.name, tuple(sorted((names or {}).items())))
        if key not in self.meshes:
            from harness.distributed.parallel import device_mesh
            self.meshes[key] = device_mesh(spec, self.device_type, names)
        return self.meshes[key]


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def _redirect_output(log_dir: Path, rank: int):
    log = open(log_dir / f"rank{rank}.log", "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    return log


def _cpu_timeout_s(group) -> float | None:
    """The timeout a group's CPU (gloo) backend runs its collectives under, as torch holds it
    (None where this torch does not say)."""
    import torch
    try:
        return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except (AttributeError, RuntimeError):
        return None


def own_gpu(env, local_rank: int) -> int:
    """Before CUDA starts: the rank's GPU (r mod G of the launch's) made the only one it sees,
    so threads and processes that never call ``set_device`` -- DCP's async-save thread and its
    stager (``torch.cuda.current_stream()``), which take the rank's environment -- use it, not
    GPU 0 (else each rank of GPU 1 makes a second CUDA context on GPU 0 in its async saves).
    The device index to use (0, or r mod G where the launch named no GPUs)."""
    ids = [i for i in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if i.strip()]
    if not ids:
        import torch
        return local_rank % torch.cuda.device_count()
    env["CUDA_VISIBLE_DEVICES"] = ids[local_rank % len(ids)]
    return 0


def _init(plan: dict, timeline: dict, log_path: str):
    import torch
    import torch.distributed as dist

    from harness import backends
    from harness.worker import context_gate
    timeline["imports"] = time.time()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    timeout = timedelta(seconds=plan["collective_timeout_s"])
    # the groups form under the launch's set-up timeout (connections, not a case's collective),
    # then take the timeouts their collectives run under
    setup = timedelta(seconds=plan["setup_timeout_s"])
    if plan["device"] == "cuda":  # the rank sees its GPU alone (own_gpu's reasons)
        device = torch.device("cuda", own_gpu(os.environ, local_rank))
        timeline["context_wait_s"] = context_gate.wait_turn()  # the run's larger worlds first
        torch.cuda.set_device(device)
        context_gate.ready(rank)
        timeline["cuda_context"] = time.time()
        if os.environ.get(PG_BACKEND_VAR) == "gloo":
            # gloo on GPUs (launch/placement.py): NCCL refuses two ranks on one device, gloo
            # runs every collective on CUDA tensors
            dist.init_process_group("gloo", timeout=setup)
        else:  # a GPU per rank over NCCL; async DCP needs a CPU backend beside it
            dist.init_process_group("cpu:gloo,cuda:nccl", timeout=setup, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=setup)
    control = dist.new_group(backend="gloo", timeout=setup)
    # Inside a unit a rank may be where the others never arrive (one raised): the harness's own
    # collectives there go over a group of their own, so the control group's agreement after
    # the unit always pairs up; a timed-out exchange is caught by the health check.
    exchange = dist.new_group(backend="gloo", timeout=setup)
    async_group = dist.new_group(backend="gloo", timeout=setup)
    groups = {"main": (dist.group.WORLD, timeout),
              "control": (control, timedelta(seconds=plan["control_timeout_s"])),
              "exchange": (exchange, timeout), "async": (async_group, timeout)}
    for group, t in groups.values():
        dist.distributed_c10d._set_pg_timeout(t, group)
    timeline["group_timeouts_s"] = {name: _cpu_timeout_s(group)
                                    for name, (group, _) in groups.items()}
    torch.use_deterministic_algorithms(True, warn_only=True)
    timeline["process_group"] = time.time()
    from harness.distributed import stager
    from harness.worker import stager_fork
    stager.use(stager_fork.context(log_path))  # forked where the rank server can
    if plan.get("stager"):  # the launch may run async_process saves (fed ones too)
        stager.prestart(async_group)
    backend = backends.get(plan["backend"])
    backend.preload()  # the library under test (TE) imports here, not inside the first case
    timeline["backend"] = time.time()
    return Context(rank, world, local_rank, device, device.type, control, exchange, async_group,
                   backend)


def _agree(ctx, payload: dict, timeout_s: float):
    import torch.distributed as dist
    gathered = [None] * ctx.world_size
    dist.all_gather_object(gathered, payload, group=ctx.control)
    return gathered


def run_task(ctx, task: dict, plan: dict, share=None) -> dict:
    import torch.distributed as dist

    from harness.checks.record import Recorder, merge
    from harness.distributed import faults
    from harness.spec.matrix import Case
    from harness.worker import runner

    case = Case.from_json(task["case"])
    ckpt = Path(task["ckpt_dir"])
    if ctx.rank == 0:
        ckpt.mkdir(parents=True, exist_ok=True)
    dist.barrier(group=ctx.control)
    rec, error, broken, t0 = Recorder(), None, False, time.time()
    try:
        faults.at_case_start(case, ctx.rank)
        # the phase's mesh, made here on every rank and not inside a unit: making a mesh is a
        # collective over the world (new_group), which a rank whose unit raised first never
        # joins -- its peer would wait there while it waits in the units' agreement
        ctx.mesh(case.mesh if task["phase"] == "train" else case.target,
                 ctx.backend.mesh_names(case))
        runner.run_phase(ctx, case, task["phase"], ckpt, rec, plan["health_timeout_s"],
                         for_reshard=task.get("for_reshard", False), share=share)
    except runner.GroupBroken as e:
        broken = True
        print(f"group broken: {e}", flush=True)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # incl. DCP's CheckpointException (a BaseException)
        error = traceback.format_exc()
        print(error, flush=True)
    for r in rec.rows:  # a failed unit's traceback goes to this rank's log too
        if r.get("traceback"):
            print(f"[{r['check']}] {r['traceback']}", flush=True)
    from harness.distributed import stager
    if stager.BROKEN:  # a failed process-staged save: the stagers are not reused
        print("an async_process save failed: exiting for a re-launch with fresh stagers",
              flush=True)
    payload = dict(rank=ctx.rank, rows=rec.rows, error=error, seconds=time.time() - t0,
                   broken=broken or stager.BROKEN)
    gathered = _agree(ctx, payload, plan["control_timeout_s"])
    errors = {g["rank"]: g["error"] for g in gathered if g["error"]}
    return dict(task=task["name"], case_key=case.key, phase=task["phase"],
                rows=merge([g["rows"] for g in gathered]), errors=errors,
                pg_broken=any(g["broken"] for g in gathered),
                seconds=max(g["seconds"] for g in gathered), world_size=ctx.world_size,
                started=t0, ended=time.time())


def main(argv=None, hard_exit: bool = True) -> int:
    """Run the plan's tasks and the fed ones; end with ``os._exit`` once everything is written
    (a fresh Python's teardown costs seconds) -- a forked rank returns (``hard_exit`` False)."""
    ap = argparse.ArgumentParser(prog="python -m harness.worker")
    ap.add_argument("--plan", required=True)
    args = ap.parse_args(argv)
    nice = os.nice(int(os.environ.get(NICE_VAR, "0")))  # before its imports and its stager
    from harness.worker import rank_profile, tether
    tether.tether(tether.expected_parent())  # die with the torchrun agent
    tether.set_name(f"harness-rank{os.environ.get('RANK', '')}")  # for ps / top
    profile = rank_profile.start()
    plan = json.loads(Path(args.plan).read_text())
    root = Path(plan["dir"])
    rank = int(os.environ["RANK"])
    log = _redirect_output(root / "logs", rank)
    stacks = open(root / "stacks" / f"rank{rank}.txt", "a")
    faulthandler.enable(file=log)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    progress = root / "progress" / f"rank{rank}.json"
    _write_json(progress, dict(pid=os.getpid(), task=None, state="starting", t=time.time()))
    timeline = {"main": _T_MAIN, "nice": nice}
    # a rank stuck before its process group exists is ended by torchrun (its peers' store wait
    # times out), not by the launcher's watchdog: its stacks are written before that happens
    faulthandler.dump_traceback_later(0.8 * plan["setup_timeout_s"], file=stacks)
    ctx = _init(plan, timeline, log.name)
    faulthandler.cancel_dump_traceback_later()
    from harness.distributed import gather
    from harness.worker import mode_group, runner, task_feed
    gather.GROUP = ctx.exchange
    done = set(p.stem for p in (root / "results").glob("*.json"))
    idle = lambda: _write_json(progress, dict(pid=os.getpid(), task=None, state="idle",  # noqa: E731
                                              t=time.time()))
    def start(name: str) -> None:  # the watchdog's running task, and the unit it is in
        print(f"=== task {name} start", flush=True)
        ctx.on_unit = lambda unit=None, t=time.time(): _write_json(progress, dict(
            pid=os.getpid(), task=name, state="running", t=t, **({"unit": unit} if unit else {})))
        ctx.on_unit()
    for task in task_feed.tasks(root, plan, on_idle=idle):
        if task["name"] in done:  # e.g. a DCP mode its group's first task ran
            continue
        for result in mode_group.results(ctx, task, plan, run_task, start):
            if ctx.rank == 0:
                _write_json(root / "results" / f"{result['task']}.json", result)
            done.add(result["task"])
            print(f"=== task {result['task']} end ({'error' if result['errors'] else 'ok'})",
                  flush=True)
            if result["pg_broken"] or (result["errors"]
                                       and not runner.healthy(ctx, plan["health_timeout_s"])):
                print("main process group out of step after an error: exiting for a re-launch")
                _write_json(progress, dict(pid=os.getpid(), task=None, state="pg_broken",
                                           t=time.time()))
                os._exit(EXIT_PG_BROKEN)
    timeline["tasks_done"] = time.time()  # the feed closed: the launch's teardown begins
    _write_json(progress, dict(pid=os.getpid(), task=None, state="done", t=time.time()))
    import torch.distributed as dist
    dist.barrier(group=ctx.control)  # every rank is done with its stager's collectives too
    from harness.distributed import stager
    stager.stop()
    dist.destroy_process_group()
    timeline["exit"], timeline["stager"] = time.time(), ", ".join(stager.HOW)
    _write_json(root / "progress" / f"timeline{rank}.json", timeline)
    rank_profile.finish(profile, root.name, rank, _T_MAIN)
    # Everything is written: skip the interpreter's teardown (seconds of module and thread
    # clean-up per rank at every launch's end). The stager process exits when our end of its
    # pipe closes; the launcher kills whatever of the launch is left anyway.
    sys.stdout.flush()
    sys.stderr.flush()
    log.flush()
    return 0 if not hard_exit else os._exit(0)
