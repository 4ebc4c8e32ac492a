"""--max-ranks bounds the rank processes of a run's concurrent launches (placement.fit_lanes):
where the lanes the pools want exceed it, each pool gets as many as fit, and rounding may not
break the bound."""

import gzip
import json
import random
from pathlib import Path

import pytest

from harness.launch.launcher import Launcher
from harness.launch.placement import case_backend, fit_lanes, place
from harness.launch.task_graph import TaskGraph
from harness.report import scaling
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario
from harness.speed import layers

ROOT = Path(__file__).resolve().parents[1]
POOLS = [(2, "nccl"), (2, "gloo"), (4, "nccl"), (4, "gloo"), (8, "gloo")]


def _random_pools(rng):
    pools = rng.sample(POOLS, rng.randint(1, 5))
    wanted = {p: rng.choice([1, 2, 4, 5, 10, 20]) * rng.choice([1.0, 0.8, 0.2]) for p in pools}
    return wanted, {p: p[0] * rng.choice([1, 1, 2, 4]) for p in pools}


def test_fitted_lanes_keep_the_bound_and_a_higher_bound_gives_no_pool_fewer():
    rng = random.Random(0)
    for _ in range(1000):
        wanted, cost = _random_pools(rng)
        want = {p: max(1, round(w)) for p, w in wanted.items()}
        before = dict.fromkeys(wanted, 1)
        for bound in range(1, 130):
            got = fit_lanes(wanted, cost, bound)
            ranks = sum(got[p] * cost[p] for p in got)
            assert all(1 <= got[p] <= want[p] for p in got)  # every pool runs; none over
            assert ranks <= bound or all(n == 1 for n in got.values()), (wanted, cost, bound)
            assert all(got[p] >= before[p] for p in got), (wanted, cost, bound, before, got)
            if sum(want[p] * cost[p] for p in want) <= bound:
                assert got == want  # nothing to fit
            before = got
    assert fit_lanes({(2, "gloo"): 4.6, (8, "gloo"): 0.2}, {(2, "gloo"): 2, (8, "gloo"): 8},
                     0) == {(2, "gloo"): 5, (8, "gloo"): 1}  # no bound: the wanted, rounded


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
@pytest.mark.parametrize("max_ranks", [16, 32, 42, 54, 64, 80])
def test_the_te_matrix_never_starts_more_ranks_than_the_bound(gpus, max_ranks):
    """Rounding each pool's scaled lanes had started up to 64 ranks for --max-ranks 54 on 8 GPUs,
    44 for the default 42 on 4, and 36 for 32 on one."""
    cases = expand(load_scenario(ROOT / "scenarios" / "fsdp2_tp_dcp.yaml"), "te")
    launcher = Launcher("/nonexistent", "te", "cuda", gpus=[str(i) for i in range(gpus)],
                        launches_per_gpu=4, lane_per_module=True, max_ranks=max_ranks)
    graph = TaskGraph(cases, "/nonexistent", lambda c: "all", lambda c: case_backend(c, launcher))
    launcher.expect(cases, graph.all)
    pools = {graph.key(t)[1:] for t in graph.all}
    lanes = {p: len(launcher.slots(*p)) for p in pools}
    least = sum(w * len(place(w, launcher.gpus).slices) for w, _ in pools)  # a lane a slice
    assert sum(n * w for (w, _), n in lanes.items()) <= max(max_ranks, least), lanes


def test_the_default_bound_gives_the_measured_lanes():
    """The whole TE matrix's tasks as one H200 ran them: at the default 42 ranks, 5 / 4 / 2
    lanes of 2 / 4 / 8 ranks on one GPU and 4 NCCL + 1 gloo / 4 / 2 on two -- the lanes
    docs/performance.md's figures ran with (the same before the bound was fitted)."""
    with gzip.open(ROOT / "tests" / "fixtures" / "te-matrix-tasks-h200.json.gz", "rt") as f:
        rows = json.load(f)["tasks"]
    tasks = [dict(name=n, world=w, worlds=ws, module=m, seconds=1.0) for n, w, ws, m in rows]
    for gpus, expected in ((1, {(2, "gloo"): 5, (4, "gloo"): 4, (8, "gloo"): 2}),
                           (2, {(2, "nccl"): 4, (2, "gloo"): 1, (4, "gloo"): 4, (8, "gloo"): 2})):
        launcher = scaling.launcher_for(tasks, gpus, layers.ALL, 42)
        assert {p: len(launcher.slots(*p)) for p in scaling.pools(tasks, gpus)} == expected
