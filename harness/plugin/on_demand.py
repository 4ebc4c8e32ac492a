"""The run's calibration on demand (``calibration/on_demand.py`` holds the rules).

At collection's end :meth:`OnDemand.plan` finds the runnable cases whose calibrated quantities
have no population at their configuration -- neither in the package's ``measured.csv`` nor in
the cache of earlier runs -- and hands the scheduler their clean seeded variants, which run
beside the matrix. When such a case's result comes, :meth:`OnDemand.resolve` waits for its
variants (each a bounded case like any other), derives their populations (pooled with every
other group measuring the same population), caches the samples (pytest's cache, keyed by the
configuration, population, software versions and the case's registered failures) and judges
the case's unjudged rows by them. Where that fails the case, the pool's groups first run a
second round of seeds (``on_demand.SECOND_N``: the errors are heavy-tailed) added to the
scheduler, and the case is judged by the larger population (``second_round.py``, which also
gives a user's case a packaged population failed its round). ``--calibrate off``: no variants
run; those quantities stay unjudged (a cached population still judges them).
"""

from __future__ import annotations

import hashlib
import json

from harness import calibration
from harness.calibration import on_demand
from harness.calibration.tolerances import UNJUDGED, statistic
from harness.launch.tasks import TaskResult
from harness.plugin.second_round import Rounds, pool_of
from harness.spec.matrix import reshard_target


class Pools:
    """The run's on-demand samples, by group and by pool, and the populations they give now."""

    def __init__(self, packaged: dict):
        self.packaged = packaged
        self.measured = dict(packaged)  # packaged + cached + measured in this run
        self.refused: dict[tuple, str] = {}
        self.group_pool: dict[str, tuple] = {}  # group key -> its pool (cached or measured)
        self.group_rows: dict[str, list] = {}  # group key -> its samples' rows (all rounds)
        self.rounds2: set[str] = set()  # group keys whose samples include the second round
        self.rows: dict[tuple, list[dict]] = {}  # pool -> the samples' rows (cached too)
        self.taken: dict[tuple, dict] = {}  # pool -> the populations it gives now
        self.seen: dict[tuple, set] = {}  # pool -> its rows' (variant, row) identities

    def keys(self, pools) -> list[str]:
        """The group keys of ``pools``."""
        return [k for k, p in self.group_pool.items() if p in pools]

    def take(self, key: str, rows: list[dict]) -> None:
        """Add a group's rows to its pool and derive the pool's populations anew (meshes of
        one world size measured by two groups make one population, not the last one's): what
        the grown pool refuses no longer judges, though its first group's was taken. A pool
        with a group's second round bounds by its largest sample (``on_demand.SECOND_N``), as
        does one of TAIL_N samples (``tolerances.statistic``)."""
        pool = self.group_pool[key]
        self.group_rows.setdefault(key, []).extend(rows)
        # once each: groups that differ only by what they leave out run the same variants
        seen = self.seen.setdefault(pool, set())
        for r in rows:
            ident = (_training(r),) + tuple(r.get(k) for k in ("phase", "check", "quantity",
                                                               "metric"))
            if not r.get("case_id") or ident not in seen:
                seen.add(ident)
                self.rows.setdefault(pool, []).append(r)
        second = any(k in self.rounds2 for k in self.keys({pool}))
        found = on_demand.populations(self.rows.get(pool, []), bound="max" if second else "p99")
        self.taken[pool], refused = on_demand.screen(found, self.packaged)
        taken: dict[tuple, dict] = {}  # two pools measuring one population: the larger sample
        for k, v in ((k, v) for t in self.taken.values() for k, v in t.items()):
            if k not in taken or _size(v) > _size(taken[k]):
                taken[k] = v
        self.measured = {**self.packaged, **taken}
        self.refused.update(refused)


def _training(row: dict):
    """What a row measured: its variant -- for a train-phase row its training, which the
    variants of one case with different reshard targets share (whole groups: the same
    training, one sample), but the target's TP size (a backend may set training up for it)."""
    if row.get("phase") != "train" or not row.get("axes"):
        return row.get("case_id")
    ax = json.loads(row["axes"])
    target = reshard_target(ax.pop("reshard", None))
    return row.get("scenario"), json.dumps(ax, sort_keys=True), target.tp if target else 1


def _size(population: dict) -> tuple:
    return population["n"], population[statistic({"rel_l2": population})]


class OnDemand(Rounds):
    def __init__(self, hs):
        self.hs = hs
        self.mode = hs.config.getoption("calibrate")
        self.cache = getattr(hs.config, "cache", None)
        self.versions = hs.env.describe()  # torch, TE and its TP support, GPU capability
        self.pools = Pools(calibration.load())
        self.groups: dict[str, list] = {}  # group key -> its variants
        self.leave_out: dict[str, frozenset] = {}  # group key -> what its samples leave out
        self.case_group: dict[str, list[str]] = {}  # case id -> its groups' keys
        self.done: dict[str, float] = {}  # group key -> seconds its variants took (this run)
        self.cached: set[str] = set()  # group keys found in the cache
        self.case_leave_out: dict[str, frozenset] = {}  # case id -> its registered failures
        self.variant_group: dict[str, str] = {}  # variant id -> its group key
        self.cancelled = 0  # variants cancelled after a timeout of their configuration
        self.base: dict[str, object] = {}  # group key -> the case its variants copy
        self.second: dict[str, list] = {}  # group key -> its second round's variants (run)
        self.packaged_rounds: set[str] = set()  # group keys measured for a packaged failure
        self.whole: set[str] = set()  # group keys whose variants' train rows count too

    def _key(self, case, pg: str, leave_out: frozenset, whole: bool = False) -> str:
        """The cache key of ``case``'s variants: what a variant measures, configuration,
        population, versions and the known failures their samples leave out (``whole``: the
        train phase's rows of a reshard's variants too)."""
        v = on_demand.variants(case, seeds=(0,))[0]
        text = json.dumps([on_demand.VERSION, v.scenario, v.backend,
                           [a for a in v.axes if a[0] != "seed"],
                           v.checks, [list(w) for w in v.workarounds], self.hs.device, pg,
                           self.versions, sorted(map(str, leave_out))] + (["whole"] if whole
                                                                           else []),
                          sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def _train_base(self, case, pg: str):
        """The case whose variants measure ``case``'s train-phase populations: ``case``
        without its reshard -- unless that would run on other process groups (on two GPUs a
        dp2 -> dp4 case shares them over gloo, a dp2 case gets a GPU a rank over NCCL): then
        ``case`` itself, its variants' train rows counted too (their samples would otherwise
        land in the NCCL population and leave the case's unjudged)."""
        train = on_demand.train_only(case)
        return train if case.target is None or self.hs.env.placement(train)[0] == pg else case

    def _bases(self, case, pg: str, leave_out: frozenset, checks) -> list[str]:
        """The group keys of the variants measuring ``checks`` of ``case`` (registered)."""
        t = self._train_base(case, pg) if any(c != "reshard" for c in checks) else None
        bases = [b for b in (t, case if "reshard" in checks else None) if b is not None]
        out = []
        for base in dict.fromkeys(bases):  # (one group where the train base is the case)
            whole = base is t and base.target is not None
            key = self._key(base, pg, leave_out, whole)
            if whole:
                self.whole.add(key)
            self.pools.group_pool[key], self.base[key] = pool_of(base), base
            self.leave_out.setdefault(key, leave_out)  # (a cached group's second round)
            out.append(key)
        return out

    def pools_of(self, keys) -> set[tuple]:
        """The pools of group ``keys``, and every whole group's pool measuring the same train
        populations (its source world's, another reshard target world's pool): measured
        together, so that which of them judges a case does not depend on which came first."""
        pool = self.pools.group_pool
        train = {pool[k][:4] + pool[k][5:] for k in keys if k in self.whole}
        return {pool[k] for k in keys} | {pool[k] for k in self.whole
                                          if pool[k][:4] + pool[k][5:] in train}

    def serves(self, key: str) -> set[bool]:
        """Whether the group measures train-phase (False) or reshard (True) populations."""
        return {self.base[key].target is not None} | ({False} if key in self.whole else set())

    def plan(self, cases: list[tuple]) -> list:
        """The variants to run beside ``cases`` ((case, its xfail entries) pairs; none where
        every population is known): a case's train-phase populations from variants without
        its reshard, its reshard's from variants with it."""
        device = self.hs.device
        for case, entries in cases:
            pg, _ = self.hs.env.placement(case)
            leave_out = self.case_leave_out[case.id] = on_demand.excluded(entries)
            # against the package alone: every group of a pool is loaded or measured, not only
            # those planned before the first cached one filled it (a tolerance must not depend
            # on the cache's state)
            miss = [(c, q) for c, q in on_demand.missing(case, device, pg, self.pools.packaged)
                    if (c, None) not in leave_out and (c, q) not in leave_out]
            if not miss:  # (a registered failure is judged by its entry's bounds)
                continue
            for key in self._bases(case, pg, leave_out, {c for c, _ in miss}):
                self.case_group.setdefault(case.id, []).append(key)
                if key in self.groups or key in self.cached:
                    continue
                if self._from_cache(key):
                    continue
                if self.mode != "off":
                    self.groups[key] = on_demand.variants(self.base[key])
                    self.variant_group.update((v.id, key) for v in self.groups[key])
        seen, out = set(), []
        for vs in self.groups.values():
            for v in vs:
                if v.id not in seen:
                    seen.add(v.id)
                    out.append(v)
        return out

    def resolve(self, case, rows: list[dict], scheduler) -> int:
        """Judge ``case``'s unjudged rows (in place); how many comparisons stay unjudged. Then
        a case a packaged population failed gets its second round there (second_round.py)."""
        left = 0
        if any(r.get("outcome") == UNJUDGED for r in rows):
            # every group of the case's pools first: a pool's populations, and so the case's
            # tolerance, must not depend on which of its cases is judged first
            pools = self.pools_of(self.case_group.get(case.id, ()))
            for key in self.pools.keys(pools):
                if key in self.groups and key not in self.done:  # (cached ones were taken)
                    self._measure(key, scheduler)
            before = [dict(r) for r in rows]
            left = self._judge(case, rows)
            if self._second_round(case, rows, scheduler):  # again, by the larger pools
                rows[:] = before
                left = self._judge(case, rows)
        self._packaged_round(case, rows, scheduler)
        return left

    def _judge(self, case, rows: list[dict]) -> int:
        pg, _ = self.hs.env.placement(case)
        left = on_demand.rejudge(case, rows, self.hs.device, pg, self.pools.measured,
                                 self.pools.refused)
        left -= on_demand.by_registry(rows, self.case_leave_out.get(case.id, frozenset()))
        if left and self.mode == "off":
            for r in rows:
                if r.get("outcome") == UNJUDGED:
                    r["detail"] += "; not calibrated on demand (--calibrate off)"
        return left


def siblings(od: OnDemand, case) -> list:
    """The variants of ``od`` a timeout of ``case`` cancels: a variant's fellow variants, or a
    case's own variants where it is one of them but for the seed -- clean copies of one
    configuration, which would each wait out the same timeout (a structural hang: an uneven
    shard, a group its ranks name differently). A case with a fault, a bug switch or an async
    save may hang for that alone: its variants still run."""
    if case.id in od.variant_group:
        keys = [od.variant_group[case.id]]
    else:
        bare = {a: v for a, v in case.axes if a != "seed"}
        keys = [k for k in od.case_group.get(case.id, ()) if k in od.groups
                and {a: v for a, v in od.groups[k][0].axes if a != "seed"} == bare]
    return [v for k in keys for v in [*od.groups.get(k, ()), *od.second.get(k, ())]
            if v.id != case.id]


def cancel_after_timeout(siblings, sched, finished: dict) -> None:
    """A scheduler's ``after``: for each task of ``finished`` that timed out, the tasks of its
    case's ``siblings`` (:func:`siblings`) that have no result and no lane end as
    cancelled, saying why (a lane already running one lets it run, bounded by its timeout)."""
    held = sched.held()
    for name, r in finished.items():
        if r.status != "timeout":
            continue
        case = next(t.case for t in sched.graph.all if t.name == name)
        why = (f"cancelled: {case.id} ({name.rsplit('.', 1)[1]}) timed out after "
               f"{r.seconds:.0f} s; this clean variant of its configuration would wait as long")
        for v in siblings(case):
            for t in sched.graph.tasks.get(v.key, ()):
                if t.name not in sched.done and t.name not in held:
                    sched.done[t.name] = TaskResult(t.name, "cancelled", errors={-1: why})


def summary(od: OnDemand) -> list[str]:
    """Terminal lines: what ``od`` calibrated on demand, and what that cost."""
    out, first = [], [k for k in od.done if k in od.groups]
    second = [k for k in od.second if k not in od.packaged_rounds]
    if first:
        out.append(f"calibrated on demand: {len(first)} configuration(s) without a "
                   f"population, {sum(len(od.groups[k]) for k in first)} clean seeded "
                   f"variant(s); cached for later runs (pytest's cache)"
                   + (f"; {od.cancelled} variant(s) cancelled after a timeout of their "
                      f"configuration (not cached: measured again next run)"
                      if od.cancelled else ""))
    if second:
        out.append(f"second round of seeds (a case failed by 10): {len(second)} "
                   f"configuration(s), {sum(len(od.second[k]) for k in second)} variant(s) "
                   f"more, up to seed {on_demand.SECOND_N}")
    if od.packaged_rounds:
        out.append(f"a packaged population failed a case of a scenario the package does not "
                   f"ship: {len(od.packaged_rounds)} configuration(s) measured on demand, seeds "
                   f"1-{on_demand.SECOND_N} ({sum(len(od.second[k]) for k in od.packaged_rounds)}"
                   f" variant(s))")
    if od.done:
        out.append(f"on-demand variants: {sum(od.done.values()):.1f} case-seconds")
    if od.cached:
        out.append(f"on-demand populations from the cache of an earlier run: "
                   f"{len(od.cached)} configuration(s)")
    return out
