"""The scheduler's lanes (harness/launch/scheduler.py) with a fake launcher: one long-lived
launch per world size and slot, fed as tasks become ready; reshard tasks after their train task;
at most ``concurrency`` busy lanes; a crash re-launches only what was left; a train task that
made no checkpoint resolves its reshard task as not run. Fast and deterministic: no processes."""

import threading
import time
from pathlib import Path

from harness.launch.scheduler import Scheduler
from harness.launch.tasks import TaskResult
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario
from harness.speed import layers

ROOT = Path(__file__).resolve().parent.parent


class FakeLauncher:
    device, gpus, gpu_share = "cpu", [], "auto"  # what the scheduler reads for case_backend
    speed = layers.ALL  # and which accelerations the run uses (lane_affinity)
    """Runs each fed task at once; ``crash`` names tasks whose launch dies while they run."""

    def __init__(self, slots=1, crash=(), no_checkpoint=()):
        self._stop = threading.Event()
        self.on_record = []
        self.n_slots, self.crash, self.no_checkpoint = slots, set(crash), set(no_checkpoint)
        self.launches: list[tuple[int, dict, list[str]]] = []  # (world, slot env, tasks run)
        self.lock = threading.Lock()
        self.busy, self.max_busy = 0, 0
        self.order: list[str] = []  # every task run, in time order

    def slots(self, world, pg_backend=""):
        return [{"slot": str(i)} for i in range(self.n_slots)]

    def stop(self):
        self._stop.set()

    def _result(self, t):
        rows = []
        if t.name in self.no_checkpoint:
            rows = [dict(check="save", quantity="*", metric="coverage", outcome="failed",
                         detail="failed: disk full")]
        return TaskResult(t.name, "ok", rows=rows)

    def _enter(self):
        with self.lock:
            self.busy += 1
            self.max_busy = max(self.max_busy, self.busy)

    def _leave(self):
        with self.lock:
            self.busy -= 1

    def run_lane(self, feed, world, env):
        while True:
            tasks = feed.wait(self._stop)
            if not tasks:
                return
            ran, queue, crashed = [], list(tasks), False
            self.launches.append((world, env, ran))
            while True:
                if queue:
                    self._enter()  # a lane running a task is busy
                    t = queue.pop(0)
                    ran.append(t.name)
                    self.order.append(t.name)
                    if t.name in self.crash:
                        self.crash.discard(t.name)
                        feed.finished({t.name: TaskResult(t.name, "crash")})
                        self._leave()
                        crashed = True
                        break
                    time.sleep(0.002)
                    feed.finished({t.name: self._result(t)})
                    self._leave()
                more = feed.poll()
                if more:
                    queue += more
                elif more is None and not queue:
                    break
                elif not queue:
                    time.sleep(0.005)
            if crashed:
                feed.requeue(queue)


def _cases():
    return expand(load_scenario(ROOT / "scenarios" / "smoke.yaml"))


def _run(launcher, cases, concurrency=1):
    with Scheduler(launcher, cases, Path("/nonexistent"), concurrency=concurrency) as sched:
        return {c.key: sched.result(c) for c in cases}


def test_one_launch_per_world_size_and_reshards_after_their_train():
    cases = _cases()
    fake = FakeLauncher()
    results = _run(fake, cases)
    assert all(r.status == "ok" for r in results.values())
    worlds = sorted({w for c in cases for w in c.world_sizes})
    assert sorted(w for w, _, _ in fake.launches) == worlds  # 2 launches for 10 cases
    order = fake.order
    for c in cases:
        if c.target is not None:
            assert order.index(f"{c.key}.train") < order.index(f"{c.key}.reshard")
    assert fake.max_busy == 1  # concurrency 1: one busy lane at a time
    assert fake.launches[0][0] == max(worlds)  # the larger world first


def test_slots_share_a_world_size_when_unbounded():
    cases = [c for c in _cases() if c.world_sizes[0] == 4]
    fake = FakeLauncher(slots=2)
    results = _run(fake, cases, concurrency=None)
    assert all(r.status == "ok" for r in results.values())
    w4 = [(env["slot"], ran) for w, env, ran in fake.launches if w == 4]
    assert {slot for slot, _ in w4} == {"0", "1"}  # both slots of world 4 took cases
    names = [n for _, ran in w4 for n in ran]
    assert len(names) == len(set(names))  # no task ran twice


def test_crash_relaunches_the_rest_and_resolves_its_reshard():
    cases = [c for c in _cases() if c.world_sizes[0] == 2]
    victim = next(c for c in cases if c.target is not None)
    fake = FakeLauncher(crash={f"{victim.key}.train"})
    results = _run(fake, cases)
    assert results[victim.key].status == "crash"
    reshard = [r for r in results[victim.key].rows if r["phase"] == "reshard"]
    assert reshard and all(r["outcome"] == "not_run" for r in reshard)
    assert all("the train phase ended with crash" in r["detail"] for r in reshard)
    for c in cases:
        if c is not victim:
            assert results[c.key].status == "ok", c.key
    ran = [n for _, _, r in fake.launches for n in r]
    assert ran.count(f"{victim.key}.train") == 1  # the culprit is not run again
    assert f"{victim.key}.reshard" not in ran


def test_reshard_of_a_train_without_checkpoint_is_not_run():
    cases = [c for c in _cases() if c.target is not None
             and c.target.world_size != c.world_sizes[0]]
    victim = cases[0]
    fake = FakeLauncher(no_checkpoint={f"{victim.key}.train"})
    results = _run(fake, cases)
    reshard = [r for r in results[victim.key].rows if r["phase"] == "reshard"]
    assert reshard and all("which was not made (save failed: failed: disk full)" in r["detail"]
                           for r in reshard)
    assert f"{victim.key}.reshard" not in [n for _, _, r in fake.launches for n in r]


def test_lanes_of_a_world_size_keep_to_their_modules():
    """Two slots of one world size: each lane takes the cases of the modules it already ran
    (first use of a module costs seconds per process on GPU), not every other case."""
    cases = [c for c in expand(load_scenario(ROOT / "scenarios" / "fsdp2_tp_dcp.yaml"))
             if c.world_sizes == (2,)]
    modules = {c.ax["module"] for c in cases}
    assert len(modules) >= 4 and len(cases) >= 6 * len(modules)  # matrix order interleaves
    fake = FakeLauncher(slots=2)
    results = _run(fake, cases, concurrency=None)
    assert all(r.status == "ok" for r in results.values())
    by_key = {c.key: c.ax["module"] for c in cases}
    ran = {env["slot"]: [by_key[n.rsplit(".", 1)[0]] for n in names]
           for w, env, names in fake.launches}
    # switches between modules in a lane: without affinity each lane alternates
    switches = sum(sum(a != b for a, b in zip(ms, ms[1:])) for ms in ran.values())
    assert switches <= len(modules), ran


def test_begin_starts_the_lanes_before_any_result_is_asked_for():
    cases = _cases()
    fake = FakeLauncher()
    with Scheduler(fake, cases, Path("/nonexistent"), concurrency=1) as sched:
        sched.begin()  # the plugin then imports the report's writers while the lanes run
        deadline = time.monotonic() + 10
        while not fake.order and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fake.order, "no task ran before the first result() call"
        assert all(sched.result(c).status == "ok" for c in cases)


def test_a_lane_takes_a_module_s_async_process_saves_last():
    """Their stagers start with the launch (10-16 s on a loaded GPU host): a lane runs a
    module's other cases first, so its first async_process save does not wait for them."""
    cases = [c for c in expand(load_scenario(ROOT / "scenarios" / "fsdp2_tp_dcp.yaml"))
             if c.world_sizes == (2,)]
    by_key = {c.key: c for c in cases}

    def trains(speed):
        fake = FakeLauncher(slots=1)
        fake.speed = speed
        results = _run(fake, cases, concurrency=None)
        assert all(r.status == "ok" for r in results.values())
        (_, _, names), = fake.launches
        return [by_key[n.rsplit(".", 1)[0]] for n in names if n.endswith(".train")]
    plain = trains(layers.ALL.without("mode_group"))
    for m in {c.ax["module"] for c in plain}:
        dcp = [c.ax["dcp"] for c in plain if c.ax["module"] == m]
        first = dcp.index("async_process")
        assert first > 0 and set(dcp[first:]) == {"async_process"}, (m, dcp)
    # with mode_group a (recipe, mesh, module)'s modes are one batch, sync first (the group's
    # run): an async_process save then comes with each group
    grouped = trains(layers.ALL)
    runs = [tuple(c.ax[a] for a in ("recipe", "mesh", "module")) for c in grouped]
    for i in range(0, len(grouped), 3):
        assert len(set(runs[i:i + 3])) == 1, runs[i:i + 3]
        assert [c.ax["dcp"] for c in grouped[i:i + 3]] == ["sync", "async_thread",
                                                            "async_process"]


def _two_rank_cases():
    return [c for c in expand(load_scenario(ROOT / "scenarios" / "fsdp2_tp_dcp.yaml"), "te")
            if set(c.world_sizes) == {2} and c.mesh.tp == 1]


def test_a_costly_module_s_second_lane_takes_a_recipe_its_first_lane_did_not():
    """Six lanes for five modules (the launcher's extra lane for a costly one): with the last
    run's seconds the sixth lane takes over the module with the most seconds left per lane --
    TransformerLayer -- under a recipe its first lane has not run (each pays first use for its
    own recipes only); without seconds it weighs the number of tasks."""
    cases = _two_rank_cases()
    by_key = {c.key: c for c in cases}
    cost = {"TransformerLayer": 1.2, "MultiheadAttention": 0.53, "LayerNormMLP": 0.6}
    seconds = {f"{c.key}.{ph}": cost.get(c.ax["module"], 0.3) for c in cases
               for ph in ("train", "reshard")}
    fake = FakeLauncher(slots=6)
    with Scheduler(fake, cases, Path("/nonexistent"), seconds=seconds) as sched:
        results = {c.key: sched.result(c) for c in cases}
    assert all(r.status == "ok" for r in results.values())
    first = {env["slot"]: by_key[ran[0].rsplit(".", 1)[0]] for _, env, ran in fake.launches}
    assert [first[str(i)].ax["module"] for i in range(6)] == [
        "Linear", "LayerNormLinear", "LayerNormMLP", "MultiheadAttention", "TransformerLayer",
        "TransformerLayer"]
    assert first["5"].recipe != first["4"].recipe
    ran = [n for _, _, names in fake.launches for n in names]
    assert sorted(ran) == sorted({t.name for ts in sched.graph.tasks.values() for t in ts})


def test_a_lane_holds_two_batches_of_a_train_task_and_its_reshards():
    """A train task and the reshard tasks after it are one batch: a lane holds two (counted by
    cases, one such batch would fill the lane, whose next task would come only after its train
    task ended: an idle GPU slot)."""
    from harness.launch.scheduler import _Lane
    cases = _two_rank_cases()
    fake = FakeLauncher()
    fake.speed = layers.ALL.without("mode_group")  # (a group's modes: one batch, below)
    sched = Scheduler(fake, cases, Path("/nonexistent"))
    lane = _Lane(sched, sched.graph.keys()[0], 0, {})
    got = sched._take(lane)
    trains = [t for t in got if t.phase == "train"]
    assert len(trains) == 2 and len(got) > 2, [t.name for t in got]  # with their reshards
    assert sched.graph.batches(lane.assigned) == 2 and sched._take(lane) == []  # full
    first = [t for t in got if sched.graph.tasks[t.case.key][0].name == trains[0].name]
    for i, t in enumerate(first):  # the first batch ends: its train task, then its reshards
        assert sched._take(lane) == []  # what is left of it and the second batch: full
        sched.done[t.name] = TaskResult(t.name, "ok", seconds=0.5 if i == 0 else 0.0)
        lane.assigned.discard(t.name)
    assert len([t for t in sched._take(lane) if t.phase == "train"]) == 1
    assert sched.graph.measured_s() == {trains[0].name: 0.5}  # the next run's (timed) seconds
    # with mode_group: two groups, each a sync train task, its reshards and its further modes
    grouped = Scheduler(FakeLauncher(), cases, Path("/nonexistent"))
    lane = _Lane(grouped, grouped.graph.keys()[0], 0, {})
    got = grouped._take(lane)
    firsts = [t for t in got if t.members]
    assert len(firsts) == 2 and grouped.graph.batches(lane.assigned) == 2, [t.name for t in got]
    assert {m.name for t in firsts for m in t.members} <= {t.name for t in got}
    assert grouped._take(lane) == []  # full


def test_a_lane_takes_its_own_recipes_first_then_ones_no_lane_ran():
    """Within its module a lane takes (async_process saves last) a recipe it ran, then one no
    other lane ran, then one another lane runs: each process pays a recipe's first use
    (seconds a TE module) for as few recipes as it can."""
    from harness.speed.lane_choice import affinity
    cases = _two_rank_cases()
    pick = {(c.ax["module"], c.recipe, c.ax["dcp"]): c for c in cases
            if c.ax["reshard"] == "none"}
    me = {("TransformerLayer", "bf16")}
    other = {("TransformerLayer", "delayed"), ("Linear", "bf16")}
    left = {"TransformerLayer": 10.0, "Linear": 1.0}

    def rank(module, recipe, dcp="sync"):
        return affinity(me, pick[(module, recipe, dcp)], left, [other])

    order = [("TransformerLayer", "bf16"), ("TransformerLayer", "current"),
             ("TransformerLayer", "delayed"), ("TransformerLayer", "bf16", "async_process"),
             ("TransformerLayer", "current", "async_process"),
             ("MultiheadAttention", "bf16"),  # a module no lane ran
             ("Linear", "bf16")]  # taken over from the other lane
    keys = [rank(*k) for k in order]
    assert keys == sorted(keys), keys
    assert len(set(keys)) == len(keys)
    # a new lane takes over the module with the most seconds left per lane running it (10 / 2
    # against 1 / 1), a recipe no lane of it ran first
    new, both = set(), [me, other]
    assert affinity(new, pick[("TransformerLayer", "current", "sync")], left, both) < \
        affinity(new, pick[("TransformerLayer", "bf16", "sync")], left, both) < \
        affinity(new, pick[("Linear", "delayed", "sync")], left, both)
