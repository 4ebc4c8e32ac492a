"""Calibration on demand: a population a case needs and nobody measured is measured for it.

A case's calibrated quantities (fp32_parity, sharding_invariance, reshard) take their tolerance
from a population measured at the case's own configuration (``Case.numerics``: dims, steps, lr)
-- never from one measured at another. Where ``measured.csv`` has none, the run measures one:
clean variants of the case (:func:`variants`: seeds 1..MIN_N, no fault or mutant, every fix
and workaround on, sync DCP, the calibrated checks only) run beside the matrix, their errors
become populations exactly as the calibration scenario's do (``derive.measured``), and the
case's unjudged rows are judged by them (:func:`rejudge`). The plugin caches the populations by
configuration and software versions, so a later run pays nothing.

A population measured from the code under test trusts that code, like any calibration. A coarse
guard for fp32_parity -- whose populations are a recipe's quantization error, which a change of
dims, steps or lr moves by a small factor: where a packaged calibration of the same quantity,
recipe, loss and population kind exists at another configuration, an on-demand p99 beyond
``PLAUSIBLE_X`` times the largest of those (and beyond what fp32 reduction order makes,
``PLAUSIBLE_FLOOR``) is not taken: a systematic error would calibrate itself, so the quantity
stays ``unjudged`` with both numbers (:func:`implausible`). Reduction-order populations
(sharding_invariance, reshard) move by orders of magnitude with the number of slices, steps and
the learning rate (Adam amplifies a rounding difference in a small gradient), so no such bound
holds for them.
"""

from __future__ import annotations

import dataclasses
import json
import math

from harness.calibration import KEY, derive, twin
from harness.calibration.derive import CALIBRATED, MIN_N
from harness.calibration.tolerances import (FACTOR, FLOOR, NO_TOLERANCE, UNJUDGED,
                                          MissingTolerance, Population, lookup, statistic,
                                          tol_text)
from harness.spec import catalog

SCENARIO = derive.ON_DEMAND  # the variants' scenario name prefix
SEEDS = tuple(range(1, MIN_N + 1))
# A second round: where a case fails by a population of the first round's seeds, its pool's
# groups run seeds up to SECOND_N and the pool then bounds by its largest sample (never below
# the first round's p99, so no case it passed fails by the second): errors of parameters
# trained under Adam are heavy-tailed -- an element with a gradient near rounding noise moves
# by a step's size -- and 10 seeds bound them too tightly (measured: docs/findings.md)
SECOND_N = derive.TAIL_N
SECOND_SEEDS = tuple(range(MIN_N + 1, SECOND_N + 1))
# ... unless a failing comparison lies beyond SECOND_X times its tolerance: no larger pool
# passes it (a round's rises of a tolerance, measured: docs/findings.md); it fails as it is
SECOND_X = 100.0
# what a variant measures: part of the cached populations' key, bumped when the harness's
# numerics change (2: TE DelayedScaling builds start from fresh amax histories; 3: its
# twin runs each slice, its amax updates once a step)
VERSION = 3
CHECKS = tuple(sorted({c for c, _ in CALIBRATED}))
# extra axes set to their clean value in a variant: a sized bug, a TE mutant, a workaround
# left out, a reference fix switched off are what a case tests, not its configuration
CLEAN = {"fault": "none", "mutation": "none", "without": "none", "fixes": "all"}
# producers whose registered failure leaves these checks nothing to measure
NEEDS = {"train": CHECKS, "reference": ("fp32_parity",), "single_rank": ("sharding_invariance",),
         "expected": ("reshard",), "reshard_load": ("reshard",)}
PLAUSIBLE_X = 10.0  # an on-demand p99 beyond 10x every packaged configuration's is not taken
PLAUSIBLE_FLOOR = 1e-4  # ... unless it is below this rel-L2 (fp32 reduction order's scale)
GUARDED = ("fp32_parity",)


def quantities(case, backend: str, device: str) -> list[tuple[str, str]]:
    """The calibrated (check, quantity) pairs ``case`` records with a calibrated tolerance."""
    out = []
    for check, quantity in sorted(CALIBRATED):
        if check not in case.checks or (check == "reshard" and case.target is None):
            continue
        if check == twin.CHECK and not twin.calibrated(case, backend, device):
            continue  # bitwise, or no twin stands for it
        if quantity == "stored_params" and case.recipe not in catalog.QUANTIZED_RECIPES:
            continue  # only quantized recipes store quantized weights
        out.append((check, quantity))
    return out


def missing(case, device: str, pg_backend: str,
            measured: dict | None) -> list[tuple[str, str]]:
    """The calibrated quantities of ``case`` without a population at its configuration in
    ``measured`` (None: the package's; a scenario's own ``tolerances`` entry counts as one)."""
    where = Population.of_case(case, device, pg_backend)
    out = []
    for check, quantity in quantities(case, case.backend, device):
        try:
            lookup(check, quantity, case.recipe, case.tolerances, case.train, measured=measured,
                   loss=catalog.TASK_LOSS[case.task], where=where)
        except MissingTolerance:
            out.append((check, quantity))
    return out


def scenario_of(case) -> str:
    """The variants' scenario: one per configuration, so ids never mix two configurations."""
    return f"{SCENARIO}@{case.numerics}"


def variants(case, seeds=SEEDS) -> list:
    """The clean, seeded copies of ``case`` whose errors make its populations."""
    axes = [(a, CLEAN.get(a, v)) for a, v in case.axes if a != "seed"]
    axes = [(a, "sync" if a == "dcp" else v) for a, v in axes]
    checks = tuple(c for c in case.checks if c in CHECKS)
    return [dataclasses.replace(
        case, scenario=scenario_of(case), axes=tuple(axes) + (("seed", str(s)),),
        train=dataclasses.replace(case.train, seed=s), checks=checks, marks=())
        for s in seeds]


def train_only(case):
    """``case`` without its reshard: the variants that measure its train phase's populations
    (a reshard's known failure, or its own cost, never takes them with it)."""
    axes = tuple((a, catalog.RESHARD_NONE if a == "reshard" else v) for a, v in case.axes)
    return dataclasses.replace(case, axes=axes,
                               checks=tuple(c for c in case.checks if c != "reshard"))


def excluded(entries) -> frozenset:
    """(check, quantity or None: all of it) the case's xfail entries say fail (strictly: a
    ``strict: false`` failure is a value that may land beyond a tolerance, its clean samples
    are the population): a known bug is never measured into a tolerance (its variants run with
    the same code)."""
    out = set()
    for f in (f for e in entries for f in e.fails if f.strict):
        if f.check in CHECKS:  # a check that raises measures nothing after the error
            out.add((f.check, None if f.quantity == "error" else f.quantity))
        out.update((c, None) for c in NEEDS.get(f.check, ()))
    return frozenset(out)


def history_rows(case, rows: list[dict], status: str, device: str, pg_backend: str,
                 run_id: str, leave_out: frozenset = frozenset(),
                 reshard_only: bool = False) -> list[dict]:
    """A variant's result rows as derive.measured reads history rows, less those of the
    (check, quantity) pairs ``leave_out`` names (:func:`excluded`); ``reshard_only``: its
    reshard phase's alone (a reshard variant's training is its train-only twin's sample, which
    would count twice)."""
    rows = [r for r in rows if (r["check"], None) not in leave_out
            and (r["check"], r["quantity"]) not in leave_out
            and (not reshard_only or r.get("phase") == "reshard")]
    ax = dict(case.axes)
    base = dict(run_id=run_id, case_id=case.id, scenario=case.scenario, backend=case.backend,
                device=device, recipe=case.recipe, mesh=ax["mesh"], module=ax["module"],
                reshard=ax["reshard"], axes=json.dumps(ax), pg_backend=pg_backend,
                loss=catalog.TASK_LOSS[case.task], config=case.numerics, case_status=status)
    return [dict(base, phase=r.get("phase", ""), check=r["check"], quantity=r["quantity"],
                 metric=r["metric"], value=r["value"], tolerance=r.get("tolerance"),
                 row_outcome=r["outcome"]) for r in rows]


def populations(rows: list[dict], bound: str = "p99") -> dict[tuple, dict]:
    """Measurements (``calibration.load``'s form) of the variants' history rows, at the finest
    level only -- (configuration, module, world size) -- since one group's variants measure one
    world: a pooled level made of them would stand for worlds it never ran. The variants were
    judged unjudged or by their own packaged tolerance: both count as samples. ``bound``: "max"
    after a second round (SECOND_N; TAIL_N samples take it anyway: tolerances.statistic)."""
    if not rows:
        return {}
    import pandas as pd
    df = pd.DataFrame(rows)
    out = {}
    for r in derive.measured(df):
        if derive.ANY in (r["module"], r["world_size"]):
            continue
        key = tuple(str(r[k]) for k in KEY)
        out[key] = dict(n=int(r["n"]), p99=float(r["p99"]), max=float(r["max"]))
        if bound != "p99":
            out[key]["bound"] = bound
    return out


def implausible(key: tuple, row: dict, packaged: dict) -> str | None:
    """Why an on-demand rel-L2 measurement ``key`` -> ``row`` is not taken (None: it is): its
    p99 beyond PLAUSIBLE_X times the largest p99 of the same check, quantity, recipe, loss,
    backend, device and process groups at every packaged configuration."""
    head, kind = key[:4], key[4:7]
    stat = statistic({"rel_l2": row})  # what its tolerance takes: p99, or max
    if key[-1] != "rel_l2" or key[0] not in GUARDED or row[stat] <= PLAUSIBLE_FLOOR:
        return None
    others = [v["p99"] for k, v in packaged.items()
              if k[:4] == head and k[4:7] == kind and k[-1] == "rel_l2"]
    if not others or row[stat] <= PLAUSIBLE_X * max(others):
        return None
    return (f"on-demand {stat} rel-L2 {row[stat]:.3g} is over {PLAUSIBLE_X:g}x the largest "
            f"calibrated at any other configuration ({max(others):.3g}): a systematic error "
            f"would calibrate itself -- review it, then add the configuration to "
            f"scenarios/calibration.yaml")


def screen(found: dict, packaged: dict) -> tuple[dict, dict]:
    """(taken, refused) of on-demand measurements ``found``: refused -- its key but the metric
    (check, quantity, recipe, loss and population) -> why -- where :func:`implausible` says so
    (both metrics of it go)."""
    refused = {}
    for k, row in found.items():
        why = implausible(k, row, packaged)
        if why:
            refused[k[:-1]] = why
    return {k: v for k, v in found.items() if k[:-1] not in refused}, refused


def rejudge(case, rows: list[dict], device: str, pg_backend: str, measured: dict,
            refused: dict[tuple, str]) -> int:
    """Judge ``case``'s unjudged comparison rows (in place) by ``measured`` (packaged and
    taken on-demand populations; ``refused``: :func:`screen`'s); how many comparisons stay
    unjudged. A comparison passes when its max_abs and rel_l2 are within the
    tolerance; its unit's coverage row fails with it."""
    where = Population.of_case(case, device, pg_backend)
    loss = catalog.TASK_LOSS[case.task]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("outcome") == UNJUDGED:
            groups.setdefault((r.get("phase", ""), r["check"], r["quantity"]), []).append(r)
    left, failed_units = 0, set()
    for (phase, check, quantity), group in groups.items():
        why = None
        try:
            t = lookup(check, quantity, case.recipe, case.tolerances, case.train,
                       measured=measured, loss=loss, where=where, how="on demand")
        except MissingTolerance as e:
            t = None
            own = (check, quantity, case.recipe, loss) + where.key(derive.LEVELS[0], check)
            why = refused.get(own) or str(e)  # refused at this case's own population
        if t is None:
            left += 1
            for r in group:
                r["detail"] = f"{r.get('detail', '').split('; unjudged: ')[0]}; unjudged: {why}"
            continue
        limit = {"max_abs": t.max_abs, "rel_l2": t.rel_l2}
        ok = all(r["value"] <= limit[r["metric"]] for r in group if r["metric"] in limit)
        for r in group:
            if r["metric"] in limit:
                r["tolerance"] = limit[r["metric"]]
            r["outcome"] = "pass" if ok else "fail"
            r["tolerance_source"] = t.source
            r["detail"] = _judged(r.get("detail", ""), t.source, (t.max_abs, t.rel_l2))
        if not ok:
            failed_units.add((phase, check))
    for r in rows:
        if r.get("metric") == "coverage" and (r.get("phase", ""), r["check"]) in failed_units:
            r["outcome"] = "failed"
    return left


def failed_by(rows: list[dict], sources: tuple) -> dict[tuple, float]:
    """(phase, check, quantity) -> how many times its tolerance each comparison of ``rows``
    failed by a tolerance of ``sources`` (tolerance sources) lies beyond it, on its worst
    metric (inf: a non-finite value)."""
    out: dict[tuple, float] = {}
    for r in rows:
        if r.get("outcome") == "fail" and r.get("metric") in ("max_abs", "rel_l2") and \
                str(r.get("tolerance_source", "")).startswith(sources):
            g = (r.get("phase", ""), r["check"], r["quantity"])
            tol, value = r.get("tolerance") or 0.0, r["value"]
            need = value / tol if tol > 0 and math.isfinite(value) else math.inf
            out[g] = max(out.get(g, 0.0), need)
    return out


def second_round_may_pass(rows: list[dict], sources: tuple = ("on demand",)) -> bool:
    """Whether a pool grown by a second round could pass ``rows``' failed comparisons judged by
    ``sources``: there is one, each within SECOND_X times its tolerance (else the round changes
    no verdict). Other failures (bitwise, an error) may be registered ones: they do not count."""
    needs = failed_by(rows, sources)
    return bool(needs) and max(needs.values()) <= SECOND_X


def reproduces(first: dict | None, packaged_p99: float) -> str | None:
    """Why the on-demand rel-L2 population of a packaged configuration's seeds 1-10 (``first``)
    may not extend the package's (p99 ``packaged_p99``), else None: beyond FACTOR times it the
    code under test moved, and its samples would calibrate the change away."""
    if first is None:
        return "no clean sample of seeds 1-10 measured it"
    if first["p99"] <= FACTOR * max(packaged_p99, FLOOR / FACTOR):
        return None
    return (f"seeds 1-10 measure a p99 rel-L2 of {first['p99']:.3g} where the package measured "
            f"{packaged_p99:.3g}: the code under test moved (no second round)")


def _judged(detail: str, source: str, bounds: tuple = ()) -> str:
    """A row's detail judged by ``source`` (``bounds`` in turn for :data:`NO_TOLERANCE`)."""
    for bound in bounds:
        detail = detail.replace(f"({NO_TOLERANCE})", f"({tol_text(bound)})", 1)
    return detail.split("; unjudged: ")[0].replace("[tolerance: unjudged]",
                                                   f"[tolerance: {source}]")


def by_registry(rows: list[dict], leave_out: frozenset) -> int:
    """Unjudged comparisons (in place) that the case's xfail entries name failing: no clean
    sample of them can exist (the bug is in every variant), so the entry's own bounds judge
    them -- recorded as failing, explained only within the sizes the entry names. How many."""
    done = set()
    for r in rows:
        if r.get("outcome") == UNJUDGED and ((r["check"], None) in leave_out
                                            or (r["check"], r["quantity"]) in leave_out):
            r["outcome"], r["tolerance_source"] = "fail", "registered"
            r["detail"] = (_judged(r.get("detail", ""), "registered") + "; no clean sample: "
                           "a registered failure names it, so its xfail entry's bounds judge it")
            done.add((r.get("phase", ""), r["check"], r["quantity"]))
    return len(done)
