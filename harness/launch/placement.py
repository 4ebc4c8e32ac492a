"""Where a launch's ranks run: a GPU each over NCCL, or several sharing a GPU over gloo.

NCCL refuses two ranks on one device ("invalid usage", NCCL 2.28.9); gloo runs FSDP2's and
DCP's collectives on CUDA tensors with ranks sharing a GPU (all_reduce, broadcast,
all_gather_into_tensor, reduce_scatter_tensor, all_gather, all_to_all_single; FSDP2 training,
DCP save / load, TE FP8 modules). So a case whose world exceeds the GPUs a launch
gets runs shared: rank r on GPU r mod G, every process group of the launch gloo
(``--gpu-share auto``, the default); ``never`` skips such a case as before, ``always`` shares
even with a GPU per rank (for testing the shared path on a multi-GPU host).

A shared run is not an NCCL run: its result rows say which it was (``pg_backend``,
``ranks_per_gpu``) and calibration and drift never pool the two. So a case runs every phase on
one backend: where one phase shares (a 4-rank train phase on 2 GPUs), its other phases (the
2-rank reshard load) run gloo too, a GPU per rank (``case_backend``): a reshard's next step on
NCCL moves measurably from the gloo run it continues, and would be judged by NCCL's tolerance
though recorded as gloo.

How many launches share a GPU follows from the ranks each puts on it: every rank is a process
with its own CUDA context and caching allocator (and, where its async_process stager sees the
GPU -- the ``stager_no_gpu`` layer off -- a stager with a context of its own); too many of them
ran a GPU out of memory in async_process saves (cudaErrorMemoryAllocation). So a GPU holds at
most ``MAX_RANKS_PER_GPU`` ranks of concurrent launches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.worker.main import NICE_VAR, PG_BACKEND_VAR

SHARE_MODES = ("auto", "never", "always")
MAX_RANKS_PER_GPU = 16  # ranks of all concurrent launches on one GPU (2 x 8 ran, 4 x 8 did not)
NCCL, GLOO = "nccl", "gloo"


@dataclass(frozen=True)
class Placement:
    """How one world size runs on the GPUs: ``slices`` (each a list of GPU ids for one launch),
    ``ranks_per_gpu`` (1: a GPU per rank) and the process groups' ``pg_backend``."""
    slices: tuple[tuple[str, ...], ...]
    ranks_per_gpu: int
    pg_backend: str

    @property
    def shared(self) -> bool:
        return self.ranks_per_gpu > 1


def place(world_size: int, gpus: list[str], share: str = "auto") -> Placement | None:
    """The placement of a ``world_size`` launch on ``gpus`` (visible GPU ids), or None where
    it cannot run (``share == "never"`` and too few GPUs, or no GPU at all)."""
    if share not in SHARE_MODES:
        raise ValueError(f"--gpu-share {share!r}: expected one of {', '.join(SHARE_MODES)}")
    if not gpus or world_size < 1:
        return None
    if len(gpus) >= world_size and share != "always":
        n = len(gpus) // world_size
        return Placement(tuple(tuple(gpus[i * world_size:(i + 1) * world_size])
                               for i in range(n)), 1, NCCL)
    if share == "never":
        return None
    # always: two ranks a GPU (or more where GPUs are fewer); auto: every GPU, shared
    used = gpus[:max(1, min(len(gpus), world_size // 2))] if share == "always" else gpus
    rpg = math.ceil(world_size / len(used))
    return Placement((tuple(used),), rpg, GLOO if rpg > 1 else NCCL)


def case_backend(case, on) -> str:
    """The process-group backend every phase of ``case`` runs with ``on`` a host (its
    ``device``, ``gpus`` and ``gpu_share``: a Launcher): gloo where any phase shares a GPU, else
    nccl ("" on CPU, without GPUs, or where some phase cannot run)."""
    if on.device != "cuda" or not on.gpus:
        return ""
    return describe(case.world_sizes, on.gpus, on.gpu_share)[0]


def launches_per_slice(p: Placement, launches_per_gpu: int, modules: int = 0,
                       extra: int = 0, per_gpu_world: int = 0) -> int:
    """Concurrent launches on each slice: ``launches_per_gpu``, or one per module where the
    world's cases use more ``modules`` (0: not counted), and ``extra`` more for costly modules
    (``lane_choice.extra_lanes``) -- fewer where their ranks would put more than
    ``MAX_RANKS_PER_GPU`` on a GPU.

    A rank process pays each module's first use once (TE's compiled functions, cuDNN's
    attention graphs, kernel loading: seconds a module) and the scheduler keeps a lane on its
    modules (``scheduler.affinity``): with a lane per module every module's cases start at once
    and none is first used in a second lane.

    ``per_gpu_world`` (the world size, where the layer ``lanes_per_gpu`` is on): that count is
    what ONE GPU takes of that world's launches (all their ranks on it), and a slice of g GPUs
    takes g times as many: each GPU and its share of the host's cores then hold as many of the
    world's ranks as on a one-GPU host, and the world's cases split over g times the lanes.
    Without it a slice takes one GPU's count whatever its GPUs (the 2-rank cases on 2 GPUs
    ran in as many lanes as on one)."""
    wanted = max(launches_per_gpu, modules + extra if modules else 0)
    if not per_gpu_world:
        return max(1, min(wanted, MAX_RANKS_PER_GPU // p.ranks_per_gpu))
    one_gpu = max(1, min(wanted, MAX_RANKS_PER_GPU // per_gpu_world))
    return max(1, min(one_gpu * len(p.slices[0]), MAX_RANKS_PER_GPU // p.ranks_per_gpu))


def fit_lanes(wanted: dict, cost: dict, max_ranks: int) -> dict:
    """Lanes per GPU slice of each pool: ``wanted`` (a pool's lanes a slice, a real number: its
    share of a world split between NCCL and gloo) rounded, at least 1 a pool -- and where
    ``max_ranks`` bounds the host's rank processes (0: no bound) and they would exceed it, as
    many as fit, a lane costing ``cost`` ranks (the world size times the pool's slices): from
    one lane each, the next lane goes to the pool with the fewest of its lanes so far (its k-th
    lane at ``wanted / k``, the larger world first of equals) until the next would break the
    bound. Each pool keeps one lane (a pool always runs), and a higher bound never gives a pool
    fewer lanes."""
    want = {k: max(1, round(w)) for k, w in wanted.items()}
    if not max_ranks or sum(want[k] * cost[k] for k in want) <= max_ranks:
        return want
    got = dict.fromkeys(want, 1)
    ranks = sum(cost.values())
    while True:
        more = [k for k in got if got[k] < want[k]]
        if not more:
            return got
        k = max(more, key=lambda k: (wanted[k] / (got[k] + 1), cost[k]))
        if ranks + cost[k] > max_ranks:
            return got
        got[k] += 1
        ranks += cost[k]


def describe(world_sizes, gpus: list[str], share: str) -> tuple[str, int]:
    """(pg_backend, ranks_per_gpu) of a case whose phases run on ``world_sizes``: gloo where
    any phase shares a GPU, with the most ranks any phase puts on one."""
    ps = [place(w, gpus, share) for w in world_sizes]
    if any(p is None for p in ps):
        return "", 0
    return (GLOO if any(p.shared for p in ps) else NCCL), max(p.ranks_per_gpu for p in ps)


NICE_STEP = 1.25  # CFS: one nice level ~1.25x less CPU weight
NICE_MAX = 19


def cpu_priority(world_size: int, largest: int) -> int:
    """The nice value of a ``world_size`` launch's ranks when launches of up to ``largest``
    ranks share the host's cores: a rank's CPU weight proportional to its world size (0 for
    the largest). Every collective waits for the slowest rank of its world, so a descheduled
    rank of 8 holds up 7 others, one of 2 holds up 1 -- and the largest worlds are the run's
    tail."""
    if largest <= world_size:
        return 0
    return min(NICE_MAX, round(math.log(largest / world_size, NICE_STEP)))


def launch_env(p: Placement, world_size: int, largest: int, pg_backend: str = "") -> dict:
    """What a launch placed by ``p`` tells its ranks: gloo where they share a GPU or run a
    phase of a case that shares in another (``pg_backend``), and their nice value (where
    launches of up to ``largest`` ranks run)."""
    env = {PG_BACKEND_VAR: GLOO} if p.shared or pg_backend == GLOO else {}
    nice = cpu_priority(world_size, largest)
    return {**env, NICE_VAR: str(nice)} if nice else env


def pool_shares(pools) -> dict[tuple, float]:
    """(world size, process-group backend) -> its share of the world's tasks, from ``pools``
    (each task's (world size, backend)), where a world's tasks run on two backends: on 2 GPUs
    the 2-rank phases of cases that share a GPU in another phase run gloo beside the NCCL
    2-rank cases, and each pool took the world's whole lane count (the gloo pool's 8 lanes had
    66 tasks of 376, and waited)."""
    counts: dict[tuple, int] = {}
    for key in pools:
        counts[key] = counts.get(key, 0) + 1
    worlds: dict[int, int] = {}
    for (w, _), n in counts.items():
        worlds[w] = worlds.get(w, 0) + n
    return {(w, pg): n / worlds[w] for (w, pg), n in counts.items() if n < worlds[w]}
