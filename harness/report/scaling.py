"""The scaling model: a GPU run's wall time on 1, 2, 4 and 8 GPUs of the same kind, predicted
from one run's task seconds -- a figure to check on paper and to plan hosts that are not lent.

A run's tasks fall into *pools*, one per (world size, process-group backend): the scheduler
runs each pool in its own lanes (launch/scheduler.py), the pools at once. On G GPUs a pool of
world w runs on ``L(w, G)`` lanes, the launcher's own count (launch/placement.py: NCCL where w
GPUs are free, else shared over gloo; with ``lanes_per_gpu`` one GPU's launches times the GPUs
of a slice). The model::

    wall(G) = session + start + max over pools of  W / L(w, G)

* ``W``: the pool's task seconds summed (each task's seconds in the run, its first rank's);
* ``start``: a launch's start (process, imports, CUDA context, process groups, backend), the
  median over the run's launches -- the lanes start at once;
* ``session``: pytest's own time before the first launch and after the last one.

It assumes what the placement is built for: every GPU (and its 16 cores on the lent hosts)
holds as many ranks on every host, so a task takes the seconds it took in the run. It does not
know that a task moves from shared gloo to NCCL (a 2-rank case on one GPU vs two): such pools
are named (``backend_changes``). ``W / L`` is perfect balance: the longest task, a module's
first use in a new lane, and the scheduler's order all add to it.
"""

from __future__ import annotations

from statistics import median

from harness.launch.placement import describe, launches_per_slice, place
from harness.launch.tasks import START_PHASES
from harness.speed import layers

GPU_COUNTS = (1, 2, 4, 8)
LAUNCHES_PER_GPU = 4  # plugin/execution.py's default


def lanes(world: int, gpus: int, modules: int, per_gpu: bool = True) -> int:
    """Lanes of a pool of ``world`` on ``gpus`` GPUs, as the launcher counts them
    (``Launcher.slots``: the same for NCCL and gloo pools of a world) where the world's cases
    use ``modules`` modules."""
    p = place(world, [str(i) for i in range(gpus)], "auto")
    if p is None:
        return 0
    return len(p.slices) * launches_per_slice(p, LAUNCHES_PER_GPU, modules, 0,
                                              world if per_gpu else 0)


def pools(tasks: list[dict], gpus: int) -> dict[tuple, dict]:
    """(world, backend on ``gpus`` GPUs) -> {seconds, tasks} of the run's ``tasks``
    (execution.task_records: world, worlds, module, seconds)."""
    out: dict[tuple, dict] = {}
    ids = [str(i) for i in range(gpus)]
    for t in tasks:
        pool = out.setdefault((t["world"], describe(t["worlds"], ids, "auto")[0]),
                              dict(seconds=0.0, tasks=0))
        pool["seconds"] += t["seconds"]
        pool["tasks"] += 1
    return out


def modules_by_world(tasks: list[dict]) -> dict[int, int]:
    """World size -> the modules of the cases with a phase on it (``Launcher.expect``)."""
    out: dict[int, set] = {}
    for t in tasks:
        for w in t["worlds"]:
            out.setdefault(w, set()).add(t["module"])
    return {w: len(m) for w, m in out.items()}


def start_s(launches: list[dict]) -> float:
    """A launch's start: the median over the run's launches that ran a task."""
    starts = [sum(rec["phases"].get(p, 0.0) for p in START_PHASES)
              for rec in launches if rec.get("phases") and rec.get("tasks")]
    return median(starts) if starts else 0.0


def predict(tasks: list[dict], launches: list[dict], session_s: float, gpus: int,
            per_gpu: bool = True) -> dict:
    """The predicted wall on ``gpus`` GPUs: its parts and the pool that bounds it."""
    start, modules, work = start_s(launches), modules_by_world(tasks), {}
    for (world, pg), pool in pools(tasks, gpus).items():
        n = lanes(world, gpus, modules.get(world, 1), per_gpu)
        work[f"{world}/{pg}"] = dict(seconds=round(pool["seconds"], 2), lanes=n,
                                     per_lane_s=round(pool["seconds"] / max(n, 1), 2))
    bound = max(work, key=lambda k: work[k]["per_lane_s"]) if work else ""
    wall = session_s + start + (work[bound]["per_lane_s"] if bound else 0.0)
    return dict(gpus=gpus, wall_s=round(wall, 1), session_s=round(session_s, 1),
                start_s=round(start, 1), bound_by=bound, pools=work)


def model(meta: dict, session: dict, measured_wall: float, measured_gpus: int) -> dict | None:
    """The predictions for :data:`GPU_COUNTS` from a run's meta (its ``tasks`` and
    ``launches``) and pytest's own time (bench's ``session_s``), beside the wall measured on
    ``measured_gpus``; None where the run recorded no task seconds (CPU runs: no GPUs)."""
    tasks = meta.get("tasks") or []
    if not tasks or not measured_gpus:
        return None
    per_gpu = "lanes_per_gpu" in layers.from_described(meta.get("accelerations") or "all")
    sess = sum(session.values()) if session else 0.0
    ran = {str(t["world"]) + "/" + t["pg"] for t in tasks}
    out = {"measured": dict(gpus=measured_gpus, wall_s=round(measured_wall, 1)),
           "predicted": [predict(tasks, meta.get("launches", []), sess, g, per_gpu)
                         for g in GPU_COUNTS]}
    for p in out["predicted"]:
        p["backend_changes"] = sorted(set(p["pools"]) - ran)
    return out


def render(m: dict) -> list[str]:
    """Lines for the bench's printout: a prediction per GPU count, the measured one beside."""
    got = m["measured"]
    lines = ["  scaling model (report/scaling.py; wall = pytest + a launch's start + the "
             "slowest pool's seconds per lane):"]
    for p in m["predicted"]:
        mark = f"   measured {got['wall_s']:.1f} s" if p["gpus"] == got["gpus"] else ""
        changes = f"; NCCL/gloo differ from the run: {', '.join(p['backend_changes'])}" \
            if p["backend_changes"] else ""
        lines.append(f"    {p['gpus']} GPU(s): {p['wall_s']:6.1f} s = {p['session_s']} + "
                     f"{p['start_s']} + {p['bound_by']} {p['pools'][p['bound_by']]['seconds']} s"
                     f" / {p['pools'][p['bound_by']]['lanes']} lanes{mark}{changes}")
    return lines
