"""--max-ranks bounds the rank processes of a run's concurrent launches (placement.fit_lanes):
the lanes each pool gets are scaled to fit, and rounding them may not break the bound."""

import random
from pathlib import Path

import pytest

from harness.launch.launcher import Launcher
from harness.launch.placement import case_backend, fit_lanes, place
from harness.launch.task_graph import TaskGraph
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def test_fitted_lanes_keep_the_bound_and_change_nothing_within_it():
    rng = random.Random(0)
    for _ in range(2000):
        pools = rng.sample([(2, "nccl"), (2, "gloo"), (4, "nccl"), (4, "gloo"), (8, "gloo")],
                           rng.randint(1, 5))
        wanted = {p: rng.choice([1, 2, 4, 5, 10, 20]) * rng.choice([1.0, 0.8, 0.2]) for p in pools}
        cost = {p: p[0] * rng.choice([1, 1, 2, 4]) for p in pools}
        bound = rng.randint(1, 120)
        got = fit_lanes(wanted, cost, bound)
        ranks = sum(got[p] * cost[p] for p in pools)
        assert all(n >= 1 for n in got.values())  # every pool runs
        if all(n == 1 for n in got.values()):
            continue  # one lane each may still exceed a tiny bound
        assert ranks <= bound, (wanted, cost, bound, got)
        if sum(max(1, round(wanted[p])) * cost[p] for p in pools) <= bound \
                and sum(wanted[p] * cost[p] for p in pools) <= bound:
            assert got == {p: max(1, round(wanted[p])) for p in pools}  # nothing to fit
    unbounded = fit_lanes({(2, "gloo"): 4.6, (8, "gloo"): 0.2}, {(2, "gloo"): 2, (8, "gloo"): 8}, 0)
    assert unbounded == {(2, "gloo"): 5, (8, "gloo"): 1}


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
    if max_ranks == 42 and gpus <= 2:  # the configurations docs/performance.md measured
        assert lanes == ({(2, "gloo"): 5, (4, "gloo"): 4, (8, "gloo"): 2} if gpus == 1 else
                         {(2, "nccl"): 3, (2, "gloo"): 2, (4, "gloo"): 4, (8, "gloo"): 2})
