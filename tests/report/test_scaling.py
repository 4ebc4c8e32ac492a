"""The scaling model (harness/report/scaling.py): a run's wall time on 1, 2, 4 and 8 GPUs from
its task seconds, with the launcher's own lane counts."""

from pathlib import Path

import pytest

from harness.launch.launcher import Launcher
from harness.report import scaling
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario
from harness.speed import layers

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("Linear", "LayerNormLinear", "LayerNormMLP", "MultiheadAttention", "TransformerLayer")


def _task(world, worlds, module, seconds, pg="gloo"):
    return dict(name=f"{module}-{world}-{seconds}", world=world, worlds=list(worlds),
                module=module, pg=pg, seconds=seconds)


def _launch(start):
    return dict(tasks=1, phases=dict(process_start=start, cuda_context=0.0))


def test_the_wall_is_the_session_a_start_and_the_slowest_pool_per_lane():
    """Five modules: on one GPU the 2-rank pool takes 5 lanes and the 8-rank one 2 (16 ranks
    a GPU), on two the 2-rank pool goes NCCL with 10 lanes and the 8-rank one takes 4."""
    tasks = [_task(2, (2,), m, 1.0) for m in MODULES for _ in range(2)]  # 10 s
    tasks += [_task(8, (8,), m, 4.0) for m in MODULES]  # 20 s
    launches = [_launch(2.0), _launch(3.0), _launch(9.0)]
    meta = dict(tasks=tasks, launches=launches, accelerations="all")
    m = scaling.model(meta, {"before_first_launch_s": 4.0, "after_last_launch_s": 1.0}, 16.0, 1)
    one, two, four = m["predicted"][:3]
    no_first = dict(first_use_s=0.0)  # the records name no launch
    assert one["pools"] == {"2/gloo": dict(seconds=10.0, lanes=5, per_lane_s=2.0, **no_first),
                            "8/gloo": dict(seconds=20.0, lanes=2, per_lane_s=10.0, **no_first)}
    assert (one["wall_s"], one["bound_by"], one["start_s"]) == (5.0 + 3.0 + 10.0, "8/gloo", 3.0)
    assert two["pools"]["2/nccl"]["lanes"] == 10 and two["pools"]["8/gloo"]["lanes"] == 4
    # each of the 10 NCCL lanes forms a communicator while the others form theirs
    assert (two["nccl_lanes"], two["start_s"]) == (10, round(3.0 + 10 * scaling.NCCL_GROUP_S, 1))
    assert two["wall_s"] == round(5.0 + 3.0 + 10 * scaling.NCCL_GROUP_S + 5.0, 1)
    assert two["backend_changes"] == ["2/nccl"]
    assert four["pools"]["8/gloo"]["lanes"] == 8 and four["nccl_lanes"] == 20
    assert four["wall_s"] == round(5.0 + 3.0 + 20 * scaling.NCCL_GROUP_S + 2.5, 1)
    text = "\n".join(scaling.render(m))
    assert "1 GPU(s):   18.0 s = 5.0 + 3.0 + 8/gloo 10.0 s a lane (20.0 s in 2 lanes; load x1.0)" \
        " + 0.0   measured 16.0 s (the model +12%)" in text
    assert "NCCL/gloo differ from the run: 2/nccl" in text
    # without lanes_per_gpu a slice of 2 GPUs took one GPU's lanes: the 2-rank pool 5
    plain = scaling.model({**meta, "accelerations": "all but lanes_per_gpu"}, {}, 16.0, 1)
    assert plain["predicted"][1]["pools"]["2/nccl"]["lanes"] == 5
    assert scaling.model({**meta, "tasks": []}, {}, 16.0, 1) is None  # nothing to predict from
    assert scaling.model(meta, {}, 16.0, 0) is None  # a CPU run


def test_the_model_takes_the_run_s_own_launches_per_gpu():
    """A run given ``--launches-per-gpu 8`` (lane_per_module off) ran its 2-rank pool in 8
    lanes: the model's own host is predicted with 8, not the default 4."""
    tasks = [_task(2, (2,), m, 1.0) for m in MODULES for _ in range(8)]  # 40 s
    meta = dict(tasks=tasks, launches=[_launch(2.0)], launches_per_gpu=8,
                accelerations="all but lane_per_module")
    one = scaling.model(meta, {}, 7.0, 1)["predicted"][0]
    assert one["pools"]["2/gloo"] == dict(seconds=40.0, lanes=8, per_lane_s=5.0,
                                          first_use_s=0.0), one
    default = scaling.model({**meta, "launches_per_gpu": None}, {}, 12.0, 1)["predicted"][0]
    assert default["pools"]["2/gloo"]["lanes"] == 4  # the default, before a run recorded it


def test_a_case_that_shares_in_one_phase_keeps_its_other_phase_on_gloo():
    """A 2-rank train whose reshard goes to 4 ranks: on 2 GPUs the 4 ranks share, so the
    2-rank phase runs gloo too (placement.case_backend) -- a pool of its own."""
    tasks = [_task(2, (2, 4), "Linear", 1.0), _task(4, (2, 4), "Linear", 1.0),
             _task(2, (2,), "Linear", 1.0)]
    pools = scaling.pools(tasks, 2)
    assert set(pools) == {(2, "gloo"), (4, "gloo"), (2, "nccl")}
    assert set(scaling.pools(tasks, 4)) == {(2, "nccl"), (4, "nccl")}


@pytest.mark.parametrize("gpus", scaling.GPU_COUNTS)
@pytest.mark.parametrize("max_ranks", [0, 42])
@pytest.mark.parametrize("weighed", [False, True])
def test_the_model_counts_the_lanes_the_launcher_starts(gpus, max_ranks, weighed):
    """The model's lanes, from the run's task records alone, are those a launcher of the host
    starts for the real cases (Launcher.slots) for the TE matrix on every GPU count, with and
    without a bound on the host's ranks, and with the last run's seconds (TransformerLayer's
    tasks 3x the others') on a host of 64 cores, where a costly module takes a lane more."""
    from harness.launch.placement import case_backend
    from harness.launch.task_graph import TaskGraph
    cases = expand(load_scenario(ROOT / "scenarios" / "fsdp2_tp_dcp.yaml"), "te")
    launcher = Launcher("/nonexistent", "te", "cuda", gpus=[str(i) for i in range(gpus)],
                        launches_per_gpu=scaling.LAUNCHES_PER_GPU, lane_per_module=True,
                        max_ranks=max_ranks)
    graph = TaskGraph(cases, "/nonexistent", lambda c: "all", lambda c: case_backend(c, launcher))
    seconds = {t.name: 3.0 if t.case.ax["module"] == "TransformerLayer" else 1.0
               for t in graph.all} if weighed else None
    launcher.cores = 64
    launcher.expect(cases, graph.all, seconds)
    tasks = [dict(name=t.name, world=t.world_size, worlds=list(t.case.world_sizes),
                  module=t.case.ax["module"], pg=graph.key(t)[2], seconds=1.0) for t in graph.all]
    model = scaling.launcher_for(tasks, gpus, layers.ALL, max_ranks, seconds=seconds, cores=64)
    pools = {graph.key(t)[1:] for t in graph.all}
    got = {p: len(model.slots(*p)) for p in pools}
    assert got == {p: len(launcher.slots(*p)) for p in pools}
    if max_ranks:
        assert sum(n * w for (w, _), n in got.items()) <= max_ranks


def test_a_run_s_described_layers_read_back():
    for acc in (layers.ALL, layers.PLAIN, layers.parse("all,-lanes_per_gpu"),
                layers.parse("none,rank_server,task_seconds")):
        assert layers.from_described(acc.describe()) == acc


def test_a_host_whose_gpus_hold_fewer_ranks_runs_each_task_faster():
    """Bounded to 16 ranks, the 8-rank cases take the same 2 lanes on 1 and 2 GPUs, but a GPU of
    the 2-GPU host holds half the ranks: the model takes LOAD_SHARE of their seconds off by half
    (not all of them: docs/performance.md, "The scaling model")."""
    tasks = [_task(8, (8,), m, 4.0) for m in MODULES]
    meta = dict(tasks=tasks, launches=[_launch(1.0)], accelerations="all", max_ranks=16)
    one, two = scaling.model(meta, {}, 11.0, 1)["predicted"][:2]
    assert one["load"] == 1.0 and one["pools"]["8/gloo"] == dict(seconds=20.0, lanes=2,
                                                                per_lane_s=10.0, first_use_s=0.0)
    share = 1 - scaling.LOAD_SHARE * 0.5
    assert two["load"] == 0.5 and two["pools"]["8/gloo"] == dict(
        seconds=round(20.0 * share, 2), lanes=2, per_lane_s=round(10.0 * share, 2),
        first_use_s=0.0)
    assert two["wall_s"] == round(1.0 + 10.0 * share, 1)
    # from the 2-GPU run back to one GPU: the same rule, load 2
    back = scaling.model(meta, {}, 7.0, 2)["predicted"][0]
    assert back["load"] == 2.0 and back["pools"]["8/gloo"]["seconds"] == \
        round(20.0 * (1 + scaling.LOAD_SHARE), 2)


def test_a_module_s_first_use_in_each_launch_is_measured():
    """The seconds each launch's first task of a (module, recipe) took over that kind's later
    tasks' median, per pool: what a pool pays again for every launch it runs in (a fresh
    process's first TransformerLayer step took seconds on an H200: docs/performance.md)."""
    def t(launch, module, seconds, started, world=2, pg="nccl", recipe="bf16"):
        return dict(_task(world, (world,), module, seconds, pg), launch=launch, started=started,
                    recipe=recipe, name=f"{launch}-{module}-{started}")
    tasks = [t("L1", "TransformerLayer", 5.0, 0), t("L1", "TransformerLayer", 1.0, 1),
             t("L1", "TransformerLayer", 1.2, 2), t("L2", "TransformerLayer", 3.0, 0),
             t("L2", "TransformerLayer", 0.8, 1),
             t("L2", "TransformerLayer", 4.0, 2, recipe="current"),  # a kind seen once: none
             t("L1", "Linear", 0.5, 3), t("L2", "Linear", 0.1, 3),  # first uses, none later: none
             t("L3", "Linear", 2.0, 0, world=8, pg="gloo"), t("L3", "Linear", 1.0, 1, 8, "gloo")]
    got = scaling.first_use(tasks)
    assert got == {"2/nccl": dict(launches=2, seconds=round(5.0 - 1.0 + 3.0 - 1.0, 2)),
                   "8/gloo": dict(launches=1, seconds=1.0)}
    assert scaling.first_use([{k: v for k, v in x.items() if k != "launch"}
                              for x in tasks]) == {}  # records without launches
    meta = dict(tasks=tasks, launches=[_launch(1.0)], accelerations="all")
    text = "\n".join(scaling.render(scaling.model(meta, {}, 9.0, 2)))
    assert "first use in a launch, over its later tasks' median: 2/nccl 6.0 s in 2 launch(es)" \
        in text


def test_each_lane_pays_its_launch_s_first_uses_however_many_lanes_share_the_rest():
    """Four launches of one module each paid 2 s for its first use (3 s against the later
    tasks' 1 s): on the run's own host the model is the pool's seconds over its 4 lanes, on two
    GPUs (8 NCCL lanes) only the other 20 s split -- each lane pays its first use again."""
    tasks = [dict(_task(2, (2,), "Linear", 3.0 if i == 0 else 1.0), launch=f"L{k}",
                  started=float(i), recipe="bf16", name=f"L{k}-{i}")
             for k in range(1, 5) for i in range(5)]
    meta = dict(tasks=tasks, launches=[_launch(1.0)], accelerations="all")
    one, two = scaling.model(meta, {}, 9.0, 1)["predicted"][:2]
    assert one["pools"]["2/gloo"] == dict(seconds=28.0, lanes=4, per_lane_s=7.0, first_use_s=2.0)
    assert (two["load"], two["pools"]["2/nccl"]) == (1.0, dict(
        seconds=20.0 + 8 * 2.0, lanes=8, per_lane_s=20.0 / 8 + 2.0, first_use_s=2.0))
    assert "2/nccl 4.5 s a lane (36.0 s in 8 lanes, 2.0 s of it first uses; load x1.0)" in \
        "\n".join(scaling.render(scaling.model(meta, {}, 9.0, 1)))
    # a lane that ran two launches pays two launches' first uses
    tasks += [dict(t, launch="L5", name="L5-" + t["name"]) for t in tasks if t["launch"] == "L1"]
    again = scaling.model({**meta, "tasks": tasks}, {}, 9.0, 1)["predicted"][1]
    assert again["pools"]["2/nccl"]["first_use_s"] == round(2.0 * 5 / 4, 2)


def test_a_run_that_knew_its_seconds_gives_a_costly_module_more_lanes_as_its_host_did():
    """The launcher gives a module k times the mean module's seconds round(k) - 1 lanes more
    where the run knew the last run's seconds and the lanes' ranks fit the host's cores
    (lane_choice.extra_lanes): the model counts those lanes on the run's host and on the hosts
    it predicts (cores in proportion to GPUs) -- else it took a lane more for a relaunch."""
    tasks = [_task(2, (2,), m, 6.0 if m == "TransformerLayer" else 1.0) for m in MODULES
             for _ in range(2)]
    for i, t in enumerate(tasks):
        t.update(name=f"{t['module']}-{i}.train", launch=f"L{i % 7}", started=float(i))
    meta = dict(tasks=tasks, launches=[_launch(1.0)], accelerations="all", cpu_count=16,
                task_seconds_known=f"{len(tasks)} of {len(tasks)}")
    one, two = scaling.model(meta, {}, 9.0, 1)["predicted"][:2]
    assert one["pools"]["2/gloo"]["lanes"] == 5 + 2  # TransformerLayer 3x the mean
    assert two["pools"]["2/nccl"]["lanes"] == 10 + 4  # 28 ranks on 32 cores
    first = scaling.model({**meta, "task_seconds_known": f"0 of {len(tasks)}"}, {}, 9.0, 1)
    assert first["predicted"][0]["pools"]["2/gloo"]["lanes"] == 5
    few = scaling.model({**meta, "cpu_count": 8}, {}, 9.0, 1)  # 14 ranks on 8 cores: none
    assert few["predicted"][0]["pools"]["2/gloo"]["lanes"] == 5


def test_a_launch_s_context_follows_the_ranks_started_at_once_and_its_end_is_paid_once():
    """Contexts made together share the driver's time host-wide (docs/performance.md): a run
    whose lanes started 26 ranks at once and whose launches took 2.6 s of CUDA context (of a
    3.0 s start) and 1.2 s of teardown. A host that starts 52 ranks at once takes 5.2 s of
    context, one that starts 16 takes 1.6 s; the teardown of the bound lane's last launch
    adds to every prediction."""
    tasks = [_task(2, (2,), m, 1.0) for m in MODULES for _ in range(2)]  # 10 s, 5 lanes
    tasks += [_task(8, (8,), m, 4.0) for m in MODULES]  # 20 s, 2 lanes: 10 + 16 ranks
    phases = dict(process_start=0.4, cuda_context=2.6, teardown=1.2)
    meta = dict(tasks=tasks, launches=[dict(tasks=1, phases=phases)] * 3, accelerations="all")
    m = scaling.model(meta, {}, 14.0, 1)
    one, two = m["predicted"][:2]
    assert (one["ranks_at_once"], one["start_s"], one["end_s"]) == (26, 3.0, 1.2)
    assert one["wall_s"] == 3.0 + 10.0 + 1.2
    assert two["ranks_at_once"] == 10 * 2 + 4 * 8  # the 2-rank pool over NCCL, 8-rank shared
    assert two["start_s"] == round(3.0 + 2.6 * (52 / 26 - 1) + 10 * scaling.NCCL_GROUP_S, 1)
    assert two["wall_s"] == round(two["start_s"] + two["pools"]["8/gloo"]["per_lane_s"] + 1.2, 1)
    # the same run measured on two GPUs: its own host's start is the run's, one GPU's less
    back = scaling.model(meta, {}, 14.0, 2)["predicted"]
    assert back[1]["start_s"] == 3.0 and back[0]["start_s"] == round(
        3.0 + 2.6 * (26 / 52 - 1) - 10 * scaling.NCCL_GROUP_S, 1)
