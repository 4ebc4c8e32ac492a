"""A case that timed out cancels the clean variants of its configuration that no lane took yet
(plugin/on_demand.py cancel_after_timeout, the scheduler's ``after``): each would wait out the
same timeout. Found by a QA probe (2026-11-29, worlds 3 / 5 on CPU): an uneven shard hung the
case and each of its 10 on-demand variants again, 60 s each -- 11 of the probe's 14 launches."""

import functools
from pathlib import Path

from test_lanes import FakeLauncher, _cases

from harness.launch.scheduler import Scheduler
from harness.launch.tasks import TaskResult
from harness.plugin.on_demand import cancel_after_timeout


class HangingLauncher(FakeLauncher):
    """Times out the tasks named in ``hang`` (as the launcher reports a hung task)."""

    def __init__(self, hang):
        super().__init__()
        self.hang = set(hang)

    def _result(self, t):
        if t.name in self.hang:
            return TaskResult(t.name, "timeout", seconds=60.0)
        return super()._result(t)


def test_a_timeout_cancels_the_siblings_no_lane_took_and_says_why():
    cases = [c for c in _cases() if c.world_sizes == (4,)]  # smoke's 4-rank cases, no reshard
    assert len(cases) >= 3
    fake = HangingLauncher(hang={f"{c.key}.train" for c in cases})  # every one would hang
    siblings = lambda case: [c for c in cases if c is not case]  # noqa: E731 - one group
    with Scheduler(fake, cases, Path("/nonexistent"), concurrency=1,
                   after=functools.partial(cancel_after_timeout, siblings)) as sched:
        results = {c.key: sched.result(c) for c in cases}
    ran = {n.rsplit(".", 1)[0] for n in fake.order}
    cancelled = {k for k, r in results.items() if r.status == "cancelled"}
    assert cancelled and cancelled.isdisjoint(ran)  # none of them ran
    assert ran | cancelled == {c.key for c in cases}
    assert len(ran) <= 2  # the first to time out, and what its lane held already (DEPTH)
    first = next(c for c in cases if f"{c.key}.train" == fake.order[0])
    for k in cancelled:
        [why] = results[k].errors
        assert why.startswith(f"[train, launcher]\ncancelled: {first.id} (train) timed out "
                              f"after 60 s; this clean variant"), why


def test_without_a_timeout_nothing_is_cancelled():
    cases = [c for c in _cases() if c.world_sizes == (4,)]
    fake = HangingLauncher(hang=())
    siblings = lambda case: [c for c in cases if c is not case]  # noqa: E731
    with Scheduler(fake, cases, Path("/nonexistent"), concurrency=1,
                   after=functools.partial(cancel_after_timeout, siblings)) as sched:
        assert {sched.result(c).status for c in cases} == {"ok"}


def test_only_clean_copies_of_one_configuration_are_siblings(tmp_path):
    """A variant's fellows, and a case's own variants where it is one of them but for the
    seed; a faulted or async case that hangs may hang for that alone: its variants run."""
    from harness.calibration import on_demand as rules
    from harness.plugin.on_demand import OnDemand, siblings
    from harness.spec.matrix import expand
    from harness.spec.scenario import load_scenario
    (tmp_path / "mine.yaml").write_text(
        "name: mine\ndescription: d\naxes:\n  recipe: [bf16]\n  mesh: [dp2]\n"
        "  module: [Linear]\n  dcp: [sync, async_thread]\n  reshard: [none]\n"
        "  fault: [none, hang]\n")
    cases = {(c.ax["dcp"], c.ax["fault"]): c for c in expand(load_scenario(tmp_path /
                                                                           "mine.yaml"))}
    od = OnDemand.__new__(OnDemand)
    variants = rules.variants(cases[("sync", "none")])
    od.groups, od.variant_group = {"k": variants}, {v.id: "k" for v in variants}
    od.second = {}
    od.case_group = {c.id: ["k"] for c in cases.values()}  # they share the configuration
    assert siblings(od, cases[("sync", "none")]) == variants
    assert siblings(od, variants[0]) == variants[1:]
    assert siblings(od, cases[("sync", "hang")]) == []
    assert siblings(od, cases[("async_thread", "none")]) == []
