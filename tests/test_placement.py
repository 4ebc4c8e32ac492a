"""Ranks are not GPUs (harness/launch/placement.py): a case whose world exceeds the GPUs runs
with ranks sharing them over gloo; with a GPU per rank, NCCL as before. No GPU needed: the GPU
ids are given."""

from pathlib import Path

import pytest

from harness.launch import placement
from harness.launch.launcher import Launcher
from harness.launch.task_graph import TaskGraph
from harness.plugin.environment import RunEnvironment
from harness.results.case_rows import case_rows
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario
from harness.speed import layers
from harness.worker.main import NICE_VAR, PG_BACKEND_VAR, own_gpu

ROOT = Path(__file__).resolve().parent.parent


def test_a_gpu_per_rank_is_nccl_and_fewer_gpus_are_shared_over_gloo():
    p = placement.place(2, ["0", "1", "2", "3"])
    assert (p.slices, p.ranks_per_gpu, p.pg_backend) == ((("0", "1"), ("2", "3")), 1, "nccl")
    p = placement.place(8, ["0"])
    assert (p.slices, p.ranks_per_gpu, p.pg_backend) == ((("0",),), 8, "gloo")
    p = placement.place(4, ["0", "1", "2"])  # rank r on GPU r mod 3: at most 2 a GPU
    assert (p.slices, p.ranks_per_gpu, p.pg_backend) == ((("0", "1", "2"),), 2, "gloo")
    assert placement.place(4, ["0"], "never") is None
    assert placement.place(2, [], "auto") is None  # no GPU: nothing to place


def test_always_shares_even_with_a_gpu_per_rank():
    p = placement.place(4, ["0", "1", "2", "3"], "always")
    assert (p.slices, p.ranks_per_gpu, p.pg_backend) == ((("0", "1"),), 2, "gloo")
    assert placement.place(1, ["0"], "always").pg_backend == "nccl"  # one rank: nothing shared
    with pytest.raises(ValueError, match="--gpu-share 'sometimes'"):
        placement.place(2, ["0"], "sometimes")


def test_shared_slots_say_gloo_and_take_fewer_launches():
    """A GPU holds at most MAX_RANKS_PER_GPU ranks of concurrent launches (more run it out of
    memory in async_process saves)."""
    one = Launcher("/nonexistent", "te", "cuda", gpus=["0"], launches_per_gpu=4)
    assert one.slots(2) == [{"CUDA_VISIBLE_DEVICES": "0", PG_BACKEND_VAR: "gloo"}] * 4
    assert one.slots(8) == [{"CUDA_VISIBLE_DEVICES": "0", PG_BACKEND_VAR: "gloo"}] * 2
    assert one.slots(1) == [{"CUDA_VISIBLE_DEVICES": "0"}] * 4  # a GPU per rank: no share
    two = Launcher("/nonexistent", "te", "cuda", gpus=["0", "1"], launches_per_gpu=4)
    assert two.slots(2) == [{"CUDA_VISIBLE_DEVICES": "0,1"}] * 8  # 4 a GPU (lanes_per_gpu)
    never = Launcher("/nonexistent", "te", "cuda", gpus=["0"], gpu_share="never")
    assert PG_BACKEND_VAR not in never.slots(2)[0]
    assert Launcher("/nonexistent", "torch", "cpu").slots(8) == [{}]


@pytest.mark.parametrize("gpus, world, per_gpu, plain", [
    (1, 2, 5, 5), (1, 8, 2, 2),  # one GPU: the same either way
    (2, 2, 10, 5),  # NCCL, a slice of 2 GPUs: 5 a GPU as on one (the one-GPU host's 10 ranks)
    (2, 4, 8, 5),  # shared over 2 GPUs, 2 ranks a GPU: one GPU takes 4 four-rank launches
    (2, 8, 4, 4),  # 4 ranks a GPU: MAX_RANKS_PER_GPU bounds both
    (4, 2, 10, 5),  # two NCCL slices of 2 GPUs, 10 launches each
    (4, 8, 8, 5), (8, 8, 16, 5)])
def test_a_slice_of_g_gpus_takes_g_times_one_gpu_s_launches(gpus, world, per_gpu, plain):
    """The layer lanes_per_gpu: a world's ranks per GPU (and per core: 16 cores a GPU on the
    lent hosts) as on one GPU, so G GPUs run its cases in G times the lanes; plain, a slice
    took one GPU's count (the 2-rank cases on 2 H200s ran in the 5 lanes of one)."""
    p = placement.place(world, [str(i) for i in range(gpus)])
    got = placement.launches_per_slice(p, 4, modules=5, per_gpu_world=world)
    assert got == per_gpu and placement.launches_per_slice(p, 4, modules=5) == plain
    assert got * p.ranks_per_gpu <= placement.MAX_RANKS_PER_GPU
    off = Launcher("/nonexistent", "te", "cuda", gpus=[str(i) for i in range(gpus)],
                   launches_per_gpu=4, env=layers.parse("all,-lanes_per_gpu").env())
    assert len(off.slots(world)) == len(p.slices) * min(4, placement.MAX_RANKS_PER_GPU //
                                                       p.ranks_per_gpu)


def test_smaller_worlds_run_at_a_lower_cpu_priority():
    """A rank's CPU weight proportional to its world size (CFS: ~1.25x a nice level), once the
    launcher knows the run's largest world; GPU launches only (the CPU box runs one lane)."""
    assert [placement.cpu_priority(w, 8) for w in (8, 4, 2, 1)] == [0, 3, 6, 9]
    assert placement.cpu_priority(2, 2) == 0 and placement.cpu_priority(4, 2) == 0
    assert placement.cpu_priority(1, 10**6) == placement.NICE_MAX
    one = Launcher("/nonexistent", "te", "cuda", gpus=["0"], launches_per_gpu=4)
    assert NICE_VAR not in one.slots(2)[0]  # no case known yet
    cases = expand(load_scenario(ROOT / "scenarios" / "smoke.yaml"))
    assert {w for c in cases for w in c.world_sizes} == {2, 4}
    one.expect(cases)
    assert one.slots(2) == [{"CUDA_VISIBLE_DEVICES": "0", PG_BACKEND_VAR: "gloo",
                             NICE_VAR: "3"}] * 4
    assert one.slots(4)[0] == {"CUDA_VISIBLE_DEVICES": "0", PG_BACKEND_VAR: "gloo"}
    two = Launcher("/nonexistent", "te", "cuda", gpus=["0", "1"], launches_per_gpu=1)
    two.expect(cases)  # NCCL launches share the host's cores too
    assert two.slots(2) == [{"CUDA_VISIBLE_DEVICES": "0,1", NICE_VAR: "3"}] * 2
    cpu = Launcher("/nonexistent", "torch", "cpu")
    cpu.expect(cases)
    assert cpu.slots(2) == [{}]


def test_cases_skip_or_run_shared_by_the_option(monkeypatch):
    """The environment's view with a faked GPU count: the largest world that fits, and each
    case's (process-group backend, ranks per GPU) as its rows record them."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    cases = expand(load_scenario(ROOT / "scenarios" / "smoke.yaml"))
    by_world = {max(c.world_sizes): c for c in cases}
    auto = RunEnvironment("torch", "cuda", None, "auto")
    never = RunEnvironment("torch", "cuda", None, "never")
    assert never.max_world() == 1 and auto.max_world() > 8
    assert auto.placement(by_world[4]) == ("gloo", 4)
    assert auto.placement(by_world[2]) == ("gloo", 2)
    assert RunEnvironment("torch", "cpu", None).placement(by_world[4]) == ("gloo", 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert auto.placement(by_world[4]) == ("nccl", 1)


def test_a_run_mixing_shared_and_unshared_cases_records_both():
    """The history row of each case says how its ranks ran; drift baselines key on it."""
    from harness.report.history import hardware_key
    base = dict(run_id="r", scenario="s", backend="te", device="cuda", skip_reason="",
                repro="", seconds=1.0, status="ok", rows=[])
    shared = case_rows(dict(base, case_id="a", axes=[["mesh", "dp8"]], pg_backend="gloo",
                            ranks_per_gpu=8), "passed")
    own = case_rows(dict(base, case_id="b", axes=[["mesh", "dp2"]], pg_backend="nccl",
                         ranks_per_gpu=1), "passed")
    assert (shared[0]["pg_backend"], shared[0]["ranks_per_gpu"]) == ("gloo", "8")
    assert (own[0]["pg_backend"], own[0]["ranks_per_gpu"]) == ("nccl", "1")
    keys = {hardware_key("cuda", "H200", "te", r["pg_backend"], r["ranks_per_gpu"])
            for r in shared + own}
    assert keys == {"cuda/H200/te", "cuda/H200/te/gloo-shared-x8"}
    assert hardware_key("cpu", "", "torch", "gloo", "0") == "cpu/-/torch"  # CPU: as before


def test_the_report_and_summary_say_how_ranks_ran(tmp_path):
    """The report's header counts the cases that ran with ranks sharing GPUs; summary.csv has
    the columns."""
    import csv
    import sys
    sys.path.insert(0, str(ROOT / "tests" / "report"))
    from synth_history import make_case, write_run

    from harness.report import history, html
    shared = dict(make_case({"recipe": "bf16", "mesh": "dp8"}), pg_backend="gloo",
                  ranks_per_gpu=8)
    own = dict(make_case({"recipe": "bf16", "mesh": "dp2"}), pg_backend="nccl", ranks_per_gpu=1)
    write_run(tmp_path, 0, [shared, own], device="cuda", gpu="NVIDIA H100", backend="te")
    text = html.render(history.load(tmp_path / "history"))
    assert "nccl: 1 cases; gloo, ranks sharing GPUs (up to 8 a GPU): 1 cases" in text
    assert "cuda · NVIDIA H100 · gloo, ranks sharing GPUs, 8 a GPU" in text  # its own group
    (summary,) = (tmp_path / "runs").glob("*/summary.csv")
    rows = {r["case_id"]: r for r in csv.DictReader(summary.open())}
    assert {(r["pg_backend"], r["ranks_per_gpu"]) for r in rows.values()} == {("gloo", "8"),
                                                                               ("nccl", "1")}


def test_a_lane_per_module_of_a_worlds_cases_where_more():
    """By default a GPU slice takes a launch per module of a world size's cases where they use
    more than --launches-per-gpu's default (a rank pays a module's first use once, so every
    module's cases start at once) -- still at most MAX_RANKS_PER_GPU
    ranks a GPU; an explicit --launches-per-gpu is taken as given."""
    cases = expand(load_scenario(ROOT / "scenarios" / "fsdp2_tp_dcp.yaml"), "te")
    assert len({c.ax["module"] for c in cases}) == 5
    auto = Launcher("/nonexistent", "te", "cuda", gpus=["0"], launches_per_gpu=4,
                    lane_per_module=True)
    assert len(auto.slots(2)) == 4  # no case known yet
    auto.expect(cases)
    assert [len(auto.slots(w)) for w in (2, 4, 8)] == [5, 4, 2]  # 10, 16, 16 ranks on the GPU
    given = Launcher("/nonexistent", "te", "cuda", gpus=["0"], launches_per_gpu=4)
    given.expect(cases)
    assert [len(given.slots(w)) for w in (2, 4, 8)] == [4, 4, 2]
    two = [c for c in cases if c.ax["module"] in ("Linear", "TransformerLayer")]
    fewer = Launcher("/nonexistent", "te", "cuda", gpus=["0"], launches_per_gpu=4,
                     lane_per_module=True)
    fewer.expect(two)
    assert len(fewer.slots(2)) == 4  # fewer modules than the default: the default
    nccl = Launcher("/nonexistent", "te", "cuda", gpus=["0", "1"], launches_per_gpu=4,
                    lane_per_module=True)
    nccl.expect(cases)
    assert nccl.slots(2) == [{"CUDA_VISIBLE_DEVICES": "0,1", NICE_VAR: "6"}] * 10  # 5 a GPU
    cpu = Launcher("/nonexistent", "torch", "cpu", lane_per_module=True)
    cpu.expect(cases)
    assert cpu.slots(2) == [{}]


def test_a_costly_module_gets_a_lane_more_where_the_ranks_fit_the_cores(monkeypatch):
    """With the last run's task seconds (the plugin's pytest cache) a module k times the mean
    module's gets round(k) - 1 lanes more -- only while every rank of the run's lanes still
    has a core: the 2-rank TE matrix on 16 cores gets a sixth lane for TransformerLayer (12
    ranks), the whole 2/4/8-rank matrix (42 ranks) none; no seconds, no extra lane
    (harness/speed/lane_choice.py)."""
    # task seconds of a recorded 2-rank TE run
    per_task = {"Linear": 0.23, "LayerNormLinear": 0.36, "LayerNormMLP": 0.6,
                "MultiheadAttention": 0.53, "TransformerLayer": 1.2}
    from harness.speed.lane_choice import _extra
    assert _extra({"a": 7.4, "b": 11.6, "c": 19.5, "d": 17.0, "e": 38.6}) == 1
    assert _extra({"a": 7.4, "b": 11.6, "c": 19.5, "d": 17.0, "e": 0.0}) == 0
    assert _extra({"a": 5.0}) == 0
    assert _extra({"a": 1.0, "b": 1.0, "c": 13.0}) == 2  # 2.6 x the mean
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    cases = expand(load_scenario(ROOT / "scenarios" / "fsdp2_tp_dcp.yaml"), "te")
    two = [c for c in cases if c.world_sizes == (2,) and c.mesh.tp == 1]
    seconds = {f"{c.key}.{ph}": per_task[c.ax["module"]] for c in cases
               for ph in ("train", "reshard")}

    def lanes(of, secs, cpu_count=16, **kw):
        monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cpu_count)))
        launcher = Launcher("/nonexistent", "te", "cuda", gpus=["0"], launches_per_gpu=4,
                            lane_per_module=True, **kw)
        launcher.expect(of, TaskGraph(of, Path("/nonexistent"), lambda c: "all").all, secs)
        return [len(launcher.slots(w)) for w in sorted({w for c in of for w in c.world_sizes})]

    assert lanes(two, seconds) == [6]
    assert lanes(two, seconds, cpu_count=10) == [5]  # 12 ranks on 10 cores
    assert lanes(two, {}) == [5]
    assert lanes(cases, seconds) == [5, 4, 2]
    given = Launcher("/nonexistent", "te", "cuda", gpus=["0"], launches_per_gpu=4)
    tasks = TaskGraph(two, Path("/nonexistent"), lambda c: "all").all
    given.expect(two, tasks, seconds)
    assert len(given.slots(2)) == 4  # an explicit --launches-per-gpu is taken as given
    cpu = Launcher("/nonexistent", "torch", "cpu", lane_per_module=True)
    cpu.expect(two, tasks, seconds)
    assert cpu.slots(2) == [{}]


@pytest.mark.parametrize("given, per_module, n", [(None, True, 4), (3, False, 3)])
def test_the_plugin_counts_modules_unless_launches_per_gpu_is_given(tmp_path, given,
                                                                    per_module, n):
    from types import SimpleNamespace

    from harness.plugin import execution
    opts = {"work_dir": str(tmp_path / "work"), "launches_per_gpu": given, "nnodes": 1,
            "rdzv_endpoint": None, "node_launcher": None, "gpu_share": "auto"}
    hs = SimpleNamespace(
        run_id="r1", worker_id=None, backend="te", device="cuda", rank_server=None,
        launches_dir=tmp_path / "reports" / "runs" / "r1" / "launches",
        config=SimpleNamespace(getoption=opts.get),
        env=SimpleNamespace(visible_gpus=lambda: ["0"]),
        record=SimpleNamespace(report_dir=tmp_path / "reports", on_launch=lambda r: None))
    ex = execution.Execution.for_run(hs)
    try:
        assert (ex.launcher.lane_per_module, ex.launcher.launches_per_gpu) == (per_module, n)
    finally:
        ex.cleanup(keep_work=False)


def test_every_phase_of_a_case_runs_on_the_backend_it_is_recorded_with(tmp_path):
    """On 2 GPUs a dp4 -> dp2 case trains shared (gloo) and loads on 2 ranks: that phase gets a
    gloo launch of its own, a GPU per rank -- not the NCCL lanes of the world-2 cases (its next
    step on NCCL would move from the gloo run it continues, be judged by NCCL's tolerance and
    recorded as gloo). dp2 -> dp4 likewise, with a
    training of its own (not the NCCL dp2 case's)."""
    from harness.launch.task_graph import TaskGraph
    cases = {c.id.split("[")[1].rstrip("]"): c
             for c in expand(load_scenario(ROOT / "scenarios" / "fsdp2_tp_dcp.yaml"), "te")}
    down, up, dp2 = (cases["bf16-dp4-Linear-sync-to_dp2"], cases["bf16-dp2-Linear-sync-to_dp4"],
                     cases["bf16-dp2-Linear-sync-none"])

    def pg(gpus, device="cuda"):
        host = Launcher("/nonexistent", "te", device, gpus=gpus)
        return lambda c: placement.case_backend(c, host)
    assert [pg(["0", "1"])(c) for c in (down, up, dp2)] == ["gloo", "gloo", "nccl"]
    graph = TaskGraph([down, up, dp2], tmp_path, lambda c: "all", pg(["0", "1"]))
    keys = {f"{t.phase}:{t.case.id.split('[')[1].rstrip(']')}": graph.key(t) for t in graph.all}
    assert keys["reshard:bf16-dp4-Linear-sync-to_dp2"] == ("all", 2, "gloo")
    assert keys["train:bf16-dp2-Linear-sync-to_dp4"] == ("all", 2, "gloo")
    assert keys["train:bf16-dp2-Linear-sync-none"] == ("all", 2, "nccl")
    assert graph.shared_with == {}  # the gloo case trains its own, not the NCCL case's
    two = Launcher("/nonexistent", "te", "cuda", gpus=["0", "1"], launches_per_gpu=1)
    gloo = {"CUDA_VISIBLE_DEVICES": "0,1", PG_BACKEND_VAR: "gloo"}
    assert two.slots(2, "gloo") == [gloo] * 2  # a launch a GPU: lanes_per_gpu
    assert two.slots(2, "nccl") == two.slots(2) == [{"CUDA_VISIBLE_DEVICES": "0,1"}] * 2
    # one GPU: every case shares anyway (one training, as before); CPU: no backend to choose
    assert {pg(["0"])(c) for c in (down, up, dp2)} == {"gloo"}
    shared = TaskGraph([down, up, dp2], tmp_path, lambda c: "all", pg(["0"])).shared_with
    assert {k: c.key for k, c in shared.items()} == {up.key: dp2.key}
    assert pg(["0", "1"], "cpu")(dp2) == pg([])(dp2) == ""


def test_a_gloo_rank_sees_only_its_own_gpu():
    """Rank r of a gloo launch on GPUs "0,1" sees GPU r mod 2 alone (device 0): DCP's async
    thread and stager, which never call set_device, then make no context on GPU 0."""
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert own_gpu(env, 3) == 0 and env["CUDA_VISIBLE_DEVICES"] == "1"
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6"}
    assert own_gpu(env, 4) == 0 and env["CUDA_VISIBLE_DEVICES"] == "5"
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    assert own_gpu(env, 7) == 0 and env["CUDA_VISIBLE_DEVICES"] == "0"
