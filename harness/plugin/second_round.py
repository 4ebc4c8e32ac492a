"""The on-demand calibration's measuring and its second rounds (``OnDemand``'s, a mixin: its
state is ``plugin/on_demand.py``'s; the rules are ``calibration/on_demand.py``'s).

Parameter errors under Adam are heavy-tailed, so 10 clean seeds may bound a clean case too
tightly (docs/checks.md, "A second round"). Where a case fails by a margin a larger pool may
pass (``on_demand.second_round_may_pass``):

* by an **on-demand** population: every group of its pool runs seeds 11-100, the pool bounds by
  its largest sample, the case is judged again (:meth:`Rounds._second_round`);
* by a **packaged** population, in a scenario the package does not ship: the case's own
  configuration runs seeds 1-100 on demand and extends the package's bound -- only where its
  seeds 1-10 reproduce the package's p99 (``on_demand.reproduces``): a regression in the code
  under test must not calibrate itself; a package of ``derive.TAIL_N`` samples or more holds
  such a round already. The shipped scenarios are judged by the package as it is
  (:meth:`Rounds._packaged_round`).
"""

from __future__ import annotations

import functools
import json
import time

from harness.calibration import derive, on_demand
from harness.calibration.derive import MIN_N, SCENARIO_DIR
from harness.calibration.tolerances import FACTOR, UNJUDGED, Population, samples_of
from harness.checks.outcomes import COVERAGE, FAILED
from harness.spec import catalog

CACHE_PREFIX = "harness-on-demand/"  # pytest cache keys: <prefix><group key>


@functools.cache
def shipped() -> frozenset[str]:
    """The package's scenarios (their names): judged by the package as it is."""
    return frozenset(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def pool_of(v) -> tuple:
    """The variants whose samples pool into one population: backend, recipe, module, world
    size (a reshard's target too) and configuration -- meshes of one world size pool, as in the
    packaged calibration."""
    return (v.backend, v.recipe, v.ax["module"], v.mesh.world_size,
            v.target.world_size if v.target else None, v.numerics)


class Rounds:
    def _measure(self, key: str, scheduler, second: bool = False) -> None:
        """Run (wait for) the group's variants (``second``: its second round's) and take their
        populations; cached for later runs unless a variant was cancelled (a later run
        measures the group again)."""
        rows, seconds, cancelled = [], 0.0, 0
        for v in self.second[key] if second else self.groups[key]:
            res = scheduler.result(v)
            pg, _ = self.hs.env.placement(v)
            seconds += res.seconds or 0.0
            cancelled += res.status == "cancelled"
            rows += on_demand.history_rows(v, res.rows, res.status, self.hs.device, pg,
                                           self.hs.run_id, self.leave_out[key],
                                           reshard_only=v.target is not None and
                                           key not in self.whole)
        write_history(self.hs, rows, key + ("-2" if second else ""))
        if second:
            self.pools.rounds2.add(key)
        self.pools.take(key, rows)
        self.done[key] = self.done.get(key, 0.0) + seconds
        self.cancelled += cancelled
        if self.cache is not None and not cancelled:
            self.cache.set(CACHE_PREFIX + key, {"rows": self.pools.group_rows[key],
                                                "at": time.time(),
                                                "second": key in self.pools.rounds2})

    def _from_cache(self, key: str) -> bool:
        """The group's samples from pytest's cache (with its second round, where it had one),
        where an earlier run left them."""
        hit = self.cache.get(CACHE_PREFIX + key, None) if self.cache else None
        if hit is None:
            return False
        if hit.get("second"):
            self.pools.rounds2.add(key)
        self.pools.take(key, hit["rows"])
        self.cached.add(key)
        return True

    def _run_second(self, keys: list[str], seeds: dict[str, tuple], scheduler) -> None:
        """The groups ``keys`` run ``seeds[key]`` (added to the scheduler, waited for)."""
        for k in keys:
            self.second[k] = on_demand.variants(self.base[k], seeds=seeds[k])
            self.variant_group.update((v.id, k) for v in self.second[k])
        scheduler.graph.add([v for k in keys for v in self.second[k]])
        for k in keys:
            self._measure(k, scheduler, second=True)

    def _second_round(self, case, rows: list[dict], scheduler) -> bool:
        """Where an on-demand population failed ``case`` by a margin a larger pool may pass:
        the second round of every group of that pool without one. Whether any ran."""
        if self.mode == "off" or not on_demand.second_round_may_pass(
                rows, ("on demand", "calibrated")):
            return False
        failed = {c == "reshard" for _, c, _ in on_demand.failed_by(rows, ("on demand",))}
        pools = self.pools_of([k for k in self.case_group.get(case.id, ())
                               if self.serves(k) & failed])
        keys = [k for k in self.pools.keys(pools) if k not in self.pools.rounds2]
        self._run_second(keys, dict.fromkeys(keys, on_demand.SECOND_SEEDS), scheduler)
        return bool(keys)

    def _packaged_round(self, case, rows: list[dict], scheduler) -> None:
        """Where a packaged population failed ``case`` of a scenario the package does not ship,
        by a margin a larger pool may pass: its configuration's seeds 1-100 on demand judge the
        failed comparisons again (in place) where seeds 1-10 reproduce the package's p99."""
        if self.mode == "off" or case.scenario in shipped() or \
                not on_demand.second_round_may_pass(rows, ("calibrated", "on demand")):
            return
        failed = [f for f in on_demand.failed_by(rows, ("calibrated",)) if _extendable(rows, f)]
        if not failed:
            return
        pg, _ = self.hs.env.placement(case)
        leave_out = self.case_leave_out.get(case.id, frozenset())
        keys = self._bases(case, pg, leave_out, {c for _, c, _ in failed})
        # every group of those pools (as _second_round): its first round, then seeds to 100
        seeds: dict[str, tuple] = {}
        for key in self.pools.keys({self.pools.group_pool[k] for k in keys}):
            if key in self.groups and key not in self.done:  # planned: its first round first
                self._measure(key, scheduler)
            if key not in self.pools.group_rows:
                self._from_cache(key)
            if key not in self.pools.rounds2:  # seeds 1-100, less those it has
                seeds[key] = on_demand.SECOND_SEEDS if key in self.pools.group_rows else \
                    on_demand.SEEDS + on_demand.SECOND_SEEDS
        self.packaged_rounds.update(seeds)
        self._run_second(list(seeds), seeds, scheduler)
        where, kept = Population.of_case(case, self.hs.device, pg), []
        for phase, check, quantity in failed:
            group = [r for r in rows if (r.get("phase", ""), r["check"], r["quantity"]) ==
                     (phase, check, quantity) and r.get("metric") in ("max_abs", "rel_l2")]
            rel = next((r for r in group if r["metric"] == "rel_l2"), None)
            why = "no rel-L2 row" if rel is None else on_demand.reproduces(
                self._first_ten(case, pg, check, quantity, where), rel["tolerance"] / FACTOR)
            if why:
                for r in group:
                    r["detail"] = f"{r.get('detail', '')}; {why}"
                continue
            kept.append([(r, dict(r)) for r in group])
            for r in group:
                r["outcome"] = UNJUDGED
        on_demand.rejudge(case, rows, self.hs.device, pg, self.pools.measured,
                          self.pools.refused)
        for pairs in kept:  # no population after all (refused): the failure stands
            if any(r.get("outcome") == UNJUDGED for r, _ in pairs):
                for r, old in pairs:
                    r.clear()
                    r.update(old)
        bad = {(r.get("phase", ""), r["check"]) for r in rows if r.get("outcome") in FAILED}
        for r in rows:  # a unit whose comparisons all pass now passes
            if r.get("metric") == COVERAGE and r.get("outcome") == "failed" and \
                    (r.get("phase", ""), r["check"]) not in bad and \
                    any((p, c) == (r.get("phase", ""), r["check"]) for p, c, _ in failed):
                r["outcome"] = "passed"

    def _first_ten(self, case, pg: str, check: str, quantity: str, where) -> dict | None:
        """The rel-L2 population of seeds 1-10 of ``case``'s own (finest) population."""
        pool = pool_of(self._train_base(case, pg) if check != "reshard" else case)
        rows = [r for r in self.pools.rows.get(pool, ())
                if int(json.loads(r["axes"]).get("seed", 0)) <= MIN_N]
        key = (check, quantity, case.recipe, catalog.TASK_LOSS[case.task]) + \
            where.key(derive.LEVELS[0], check) + ("rel_l2",)
        return on_demand.populations(rows).get(key)


def write_history(hs, rows: list[dict], key: str) -> None:
    """The variants' rows as a history file under the report dir's
    calibration_on_demand/history -- what ``python -m harness calibrate --history DIR``
    reads to make them part of the packaged calibration."""
    if not rows or not hs.record.write_reports:
        return
    import pandas as pd
    out = hs.record.report_dir / "calibration_on_demand" / "history"
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(out / f"{hs.run_id}-{key}.parquet")


def _extendable(rows: list[dict], failed: tuple) -> bool:
    """Whether seeds 1-100 could extend the packaged population that failed ``failed`` (phase,
    check, quantity): one of TAIL_N samples or more holds as many seeds already, and bounds by
    its largest -- its failure stands (and what the round compares with is its p99)."""
    n = next((samples_of(r.get("tolerance_source", "")) for r in rows if r.get("metric") ==
              "rel_l2" and (r.get("phase", ""), r["check"], r["quantity"]) == failed), None)
    return n is None or n < derive.TAIL_N
