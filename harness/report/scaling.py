"""The scaling model: a GPU run's wall time on 1, 2, 4 and 8 GPUs of the same kind, predicted
from one run's task seconds -- a figure to check on paper and to plan hosts that are not lent.

A run's tasks fall into *pools*, one per (world size, process-group backend): the scheduler
runs each pool in its own lanes (launch/scheduler.py), the pools at once. On G GPUs a pool of
world w runs on ``L(w, G)`` lanes, the count a launcher of that host gives it for the run's
tasks (launch/launcher.py, placement.py: NCCL where w GPUs are free, else shared over gloo;
lanes per GPU, bounded by ``--max-ranks`` rank processes on the host). The model::

    wall(G) = session + start(G) + max over pools of  f * ((W - F) / L(w, G) + F / n * r) + end

* ``W``: the pool's task seconds summed (each task's seconds in the run, its first rank's);
* ``F``: what of ``W`` the pool's ``n`` launches paid for first uses -- each launch's first
  task of a module and recipe over that kind's later tasks (TE's compiled functions, kernel
  loading: seconds a process, :func:`first_use_excess`); every lane pays a launch's share
  again, ``r`` launches a lane (the run's launches over its lanes), however many lanes split
  the rest;
* ``f = 1 + LOAD_SHARE * (load - 1)``, ``load`` the rank processes a GPU holds on the
  predicted host over the run's host's: the share :data:`LOAD_SHARE` of a task's seconds
  follows it, fitted on hosts of one family whose cores grow with their GPUs;
* ``start(G)``: a launch's start (process, imports, CUDA context, process groups, backend), the
  median over the run's launches -- the lanes start at once -- with two parts that follow the
  predicted host's lanes: the CUDA context in proportion to the ranks the lanes start at once
  (contexts made together share the driver's time host-wide: ``R(G) / R``), and
  :data:`NCCL_GROUP_S` for each NCCL lane more than the run started (an NCCL communicator
  each, formed while the others form theirs);
* ``end``: a launch's teardown, the median over the run's launches (the bound lane's last
  launch ends before pytest does);
* ``session``: pytest's own time before the first launch and after the last one.

docs/performance.md ("The scaling model") checks it against measured hosts. Pools whose
backend differs from the run's are named (``backend_changes``): their task seconds are the
run's gloo ones, and NCCL's teardown is taken as the run's. It does not know that a pool's
seconds depend on the other pools' lanes (CPU priorities, a host's busy cores), nor another
host kind's cores. ``(W - F) / L`` is perfect balance: the longest task and the scheduler's
order add to it.
"""

from __future__ import annotations

from statistics import median
from types import SimpleNamespace

from harness.launch.launcher import Launcher
from harness.launch.placement import describe
from harness.launch.tasks import START_PHASES
from harness.speed import layers

GPU_COUNTS = (1, 2, 4, 8)
# the share of a task's seconds that follows the ranks a GPU of the host family holds (and its
# cores): fitted on one and two H200s, checked on another day's pair -- docs/performance.md
LOAD_SHARE = 0.64
LAUNCHES_PER_GPU = 4  # plugin/execution.py's default
# a launch's process group, for each NCCL lane the host starts at once: the median of 25 runs
# of the 2-rank half over NCCL on 2 H200s (5 to 12 lanes) -- docs/performance.md
NCCL_GROUP_S = 0.14


def launcher_for(tasks: list[dict], gpus: int, acc: layers.Accelerations, max_ranks: int,
                 launches_per_gpu: int = LAUNCHES_PER_GPU, seconds: dict | None = None,
                 cores: int | None = None) -> Launcher:
    """A launcher of a host of ``gpus`` GPUs and ``cores`` CPUs that expects the run's
    ``tasks`` under the run's lane options, weighing them by ``seconds`` as a run that knew
    them did (a costly module's lane more: lane_choice.extra_lanes): its ``slots(world, pg)``
    are the lanes that host starts (no process is started)."""
    cases = {}
    for t in tasks:  # the fields the launcher's lane counts read of a case and a task
        key = t["name"].rsplit(".", 1)[0]
        cases.setdefault(key, SimpleNamespace(key=key, world_sizes=tuple(t["worlds"]),
                                              ax={"module": t["module"]}))
    shims = [SimpleNamespace(name=t["name"], world_size=t["world"],
                             case=cases[t["name"].rsplit(".", 1)[0]]) for t in tasks]
    launcher = Launcher("/nonexistent", "te", "cuda", gpus=[str(i) for i in range(gpus)],
                        launches_per_gpu=launches_per_gpu, env=acc.without("stager_prestart")
                        .env(), lane_per_module="lane_per_module" in acc, max_ranks=max_ranks)
    launcher.cores = cores
    launcher.expect(list(cases.values()), shims, seconds)
    return launcher


def pools(tasks: list[dict], gpus: int, excess: dict[str, float] | None = None) -> dict:
    """(world, backend on ``gpus`` GPUs) -> {seconds, tasks, first_use, launches} of the run's
    ``tasks`` (execution.task_records: world, worlds, module, seconds, launch): ``first_use``
    the seconds of it its tasks paid for first uses (``excess``: :func:`first_use_excess`),
    ``launches`` the run's launches that ran them."""
    out: dict[tuple, dict] = {}
    ids = [str(i) for i in range(gpus)]
    for t in tasks:
        pool = out.setdefault((t["world"], describe(t["worlds"], ids, "auto")[0]),
                              dict(seconds=0.0, tasks=0, first_use=0.0, launches=set()))
        pool["seconds"] += t["seconds"]
        pool["tasks"] += 1
        pool["first_use"] += (excess or {}).get(t["name"], 0.0)
        if t.get("launch"):
            pool["launches"].add(t["launch"])
    return out


def first_use_excess(tasks: list[dict]) -> dict[str, float]:
    """Task name -> the seconds it paid for a module's first use: each launch's first task of a
    (module, recipe) over the median of that kind's later tasks in its pool (none below 0; none
    for a kind without later tasks). Tasks without a launch (records before it was kept) pay
    none."""
    by_pool: dict[str, list[dict]] = {}
    for t in tasks:
        if t.get("launch"):
            by_pool.setdefault(f"{t['world']}/{t['pg']}", []).append(t)
    out = {}
    for ts in by_pool.values():
        first: dict[tuple, list[dict]] = {}  # (module, recipe) -> its launches' first tasks
        later: dict[tuple, list[float]] = {}  # (module, recipe) -> every other task's seconds
        seen = set()
        for t in sorted(ts, key=lambda t: (t["launch"], t.get("started", 0.0))):
            kind = (t["module"], t.get("recipe"))
            if (t["launch"], kind) in seen:
                later.setdefault(kind, []).append(t["seconds"])
            else:
                seen.add((t["launch"], kind))
                first.setdefault(kind, []).append(t)
        for kind, firsts in first.items():
            if kind in later:
                out.update((t["name"], max(0.0, t["seconds"] - median(later[kind])))
                           for t in firsts)
    return out


def first_use(tasks: list[dict], excess: dict[str, float] | None = None) -> dict[str, dict]:
    """Per pool (``world/pg``): the seconds its launches paid for a module's first use
    (``excess``: :func:`first_use_excess`, computed where not given) and how many launches
    paid them."""
    excess, out = first_use_excess(tasks) if excess is None else excess, {}
    for t in sorted(tasks, key=lambda t: (t["world"], t["pg"])):
        if t.get("launch"):
            pool = out.setdefault(f"{t['world']}/{t['pg']}", dict(launches=set(), seconds=0.0))
            pool["launches"].add(t["launch"])
            pool["seconds"] += excess.get(t["name"], 0.0)
    return {k: dict(launches=len(v["launches"]), seconds=round(v["seconds"], 2))
            for k, v in out.items()}


def launch_parts(launches: list[dict]) -> dict[str, float]:
    """Medians over the run's launches that ran a task: a launch's ``start``, the
    ``cuda_context`` part of it, and its ``teardown``."""
    ran = [rec["phases"] for rec in launches if rec.get("phases") and rec.get("tasks")]

    def mid(values) -> float:
        return median(values) if values else 0.0
    return dict(start=mid([sum(ph.get(p, 0.0) for p in START_PHASES) for ph in ran]),
                cuda_context=mid([ph.get("cuda_context", 0.0) for ph in ran]),
                teardown=mid([ph.get("teardown", 0.0) for ph in ran]))


def lanes_at_once(launcher: Launcher, by_pool) -> tuple[int, int]:
    """(rank processes, NCCL lanes) the lanes of ``by_pool`` start at once on ``launcher``'s
    host."""
    nccl = sum(len(launcher.slots(w, pg)) for w, pg in by_pool if pg == "nccl")
    return launcher.ranks(by_pool), nccl


def predict(tasks: list[dict], launches: list[dict], session_s: float, gpus: int,
            acc: layers.Accelerations = layers.ALL, max_ranks: int = 0,
            run_at_once: tuple[int, int] = (0, 0), run_gpus: int = 0,
            launches_per_gpu: int = LAUNCHES_PER_GPU, relaunch: float = 1.0,
            excess: dict[str, float] | None = None, **host) -> dict:
    """The predicted wall on ``gpus`` GPUs (``host``: :func:`launcher_for`'s seconds and
    cores): its parts and the pool that bounds it. A pool's first uses are paid per launch (its
    run's first-use seconds over the launches that paid them, ``relaunch`` launches a lane),
    the rest shared by its lanes (``excess``: :func:`first_use_excess` of ``tasks``, computed
    where not given). Where the run's host (``run_gpus``) and what its lanes started at once
    (``run_at_once``: :func:`lanes_at_once`) are given, its task seconds follow the ranks a GPU
    holds on the predicted host against the run's by :data:`LOAD_SHARE`, and a launch's CUDA
    context and process group the lanes started at once (the module's docstring)."""
    launcher = launcher_for(tasks, gpus, acc, max_ranks, launches_per_gpu, **host)
    by_pool = pools(tasks, gpus, first_use_excess(tasks) if excess is None else excess)
    work = {}
    ranks, nccl = lanes_at_once(launcher, by_pool)
    given = bool(run_gpus and run_at_once[0])  # else: the run's host is the predicted one
    run_ranks, run_nccl = run_at_once if given else (ranks, nccl)
    load = ranks / gpus / (run_ranks / run_gpus) if given else 1.0
    f = LOAD_SHARE * (load - 1) + 1
    for (world, pg), pool in by_pool.items():
        n = max(len(launcher.slots(world, pg)), 1)
        per_launch = pool["first_use"] / len(pool["launches"]) if pool["launches"] else 0.0
        first = f * per_launch * relaunch  # a lane's
        steady = f * (pool["seconds"] - pool["first_use"])
        work[f"{world}/{pg}"] = dict(seconds=round(steady + first * n, 2), lanes=n,
                                     per_lane_s=round(steady / n + first, 2),
                                     first_use_s=round(first, 2))
    parts = launch_parts(launches)
    start = parts["start"] + parts["cuda_context"] * (ranks / run_ranks - 1 if given else 0) \
        + NCCL_GROUP_S * (nccl - run_nccl)
    bound = max(work, key=lambda k: work[k]["per_lane_s"]) if work else ""
    wall = session_s + start + (work[bound]["per_lane_s"] if bound else 0.0) + parts["teardown"]
    return dict(gpus=gpus, wall_s=round(wall, 1), session_s=round(session_s, 1),
                start_s=round(start, 1), end_s=round(parts["teardown"], 1), bound_by=bound,
                load=round(load, 2), ranks_at_once=ranks, nccl_lanes=nccl, pools=work)


def model(meta: dict, session: dict, measured_wall: float, measured_gpus: int) -> dict | None:
    """The predictions for :data:`GPU_COUNTS` from a run's meta (its ``tasks`` and
    ``launches``) and pytest's own time (bench's ``session_s``), beside the wall measured on
    ``measured_gpus``; None where the run recorded no task seconds (CPU runs: no GPUs)."""
    tasks = meta.get("tasks") or []
    if not tasks or not measured_gpus:
        return None
    acc = layers.from_described(meta.get("accelerations") or "all")
    sess = sum(session.values()) if session else 0.0
    pgs = {str(t["world"]) + "/" + t["pg"] for t in tasks}
    max_ranks = meta.get("max_ranks") or 0
    lpg = meta.get("launches_per_gpu") or LAUNCHES_PER_GPU  # the run's --launches-per-gpu
    # a run that knew its tasks' seconds gave a costly module a lane more where the host's
    # cores allowed (lane_choice.extra_lanes): the hosts predicted do too, with cores in
    # proportion to their GPUs
    known = str(meta.get("task_seconds_known") or "0").split()[0]
    weigh = {t["name"]: t["seconds"] for t in tasks} \
        if "task_seconds" in acc and known.isdigit() and int(known) else None
    per_gpu = (meta.get("cpu_count") or 0) / measured_gpus

    def host(gpus: int) -> dict:
        return dict(seconds=weigh, cores=round(per_gpu * gpus) or None)

    run = launcher_for(tasks, measured_gpus, acc, max_ranks, lpg, **host(measured_gpus))
    run_pools = pools(tasks, measured_gpus)
    at_once = lanes_at_once(run, run_pools)
    lanes = sum(len(run.slots(*p)) for p in run_pools)
    launched = len({t["launch"] for t in tasks if t.get("launch")})
    relaunch = max(1.0, launched / lanes) if lanes and launched else 1.0  # launches a lane
    excess = first_use_excess(tasks)
    out = {"measured": dict(gpus=measured_gpus, wall_s=round(measured_wall, 1)),
           "predicted": [predict(tasks, meta.get("launches", []), sess, g, acc, max_ranks,
                                 at_once, measured_gpus, lpg, relaunch, excess, **host(g))
                         for g in GPU_COUNTS]}
    for p in out["predicted"]:
        p["backend_changes"] = sorted(set(p["pools"]) - pgs)
    out["first_use"] = first_use(tasks, excess)
    return out


def render(m: dict) -> list[str]:
    """Lines for the bench's printout: a prediction per GPU count, the measured one beside."""
    got = m["measured"]
    lines = ["  scaling model (report/scaling.py; wall = pytest + a launch's start + the "
             "slowest pool's seconds per lane + a launch's end):"]
    for p in m["predicted"]:
        off = p["wall_s"] / got["wall_s"] - 1 if got["wall_s"] else 0.0
        mark = f"   measured {got['wall_s']:.1f} s (the model {off:+.0%})" \
            if p["gpus"] == got["gpus"] else ""
        changes = f"; NCCL/gloo differ from the run: {', '.join(p['backend_changes'])}" \
            if p["backend_changes"] else ""
        pool = p["pools"][p["bound_by"]]
        first = f", {pool['first_use_s']} s of it first uses" if pool.get("first_use_s") else ""
        lines.append(f"    {p['gpus']} GPU(s): {p['wall_s']:6.1f} s = {p['session_s']} + "
                     f"{p['start_s']} + {p['bound_by']} {pool['per_lane_s']} s a lane "
                     f"({pool['seconds']} s in {pool['lanes']} lanes{first}; load x{p['load']})"
                     f" + {p.get('end_s', 0.0)}{mark}{changes}")
    uses = [f"{pool} {u['seconds']} s in {u['launches']} launch(es)"
            for pool, u in (m.get("first_use") or {}).items()]
    if uses:
        lines.append("  a module's first use in a launch, over its later tasks' median: " +
                     ", ".join(uses))
    return lines
