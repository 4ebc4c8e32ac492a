"""Calibration on demand (harness/calibration/on_demand.py): a configuration nobody calibrated
gets populations measured for it, never another configuration's; what cannot be judged is
``unjudged``, never a pass and never a ``tol nan`` failure."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from harness.calibration import on_demand, tolerances
from harness.calibration.tolerances import MissingTolerance, Population, Tolerance
from harness.checks.record import Recorder
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario

SCENARIO = Path(__file__).resolve().parent / "scenarios" / "unseen_config.yaml"


def _case(recipe="bf16", fault="none", backend="reference"):
    cases = expand(load_scenario(SCENARIO), backend)
    return next(c for c in cases if c.recipe == recipe and c.ax.get("fault") == fault
                and c.ax["mesh"] == "dp3")


def test_the_configuration_is_part_of_every_population():
    """A population measured at the calibration scenario's dims, steps and lr is no tolerance
    for another configuration of the same backend, recipe, world size and module."""
    case = _case()
    assert case.numerics == "h36-f54-a4-s5-b12-o30-L2-v128-st5-lr0.003"
    same = dataclasses.replace(case, train=dataclasses.replace(case.train, seed=99))
    assert same.numerics == case.numerics  # seeds are a population's samples
    other = dataclasses.replace(case, train=dataclasses.replace(case.train, lr=1e-2))
    assert other.numerics != case.numerics
    where = Population.of_case(case, "cpu", "gloo")
    with pytest.raises(MissingTolerance):
        tolerances.lookup("fp32_parity", "params", "bf16", where=where)
    assert on_demand.missing(case, "cpu", "gloo", tolerances._MEASURED)
    calibrated = dataclasses.replace(where, world_size=2,
                                     config="h32-f72-a4-s8-b8-o30-L2-v128-st3-lr0.01")
    t = tolerances.lookup("fp32_parity", "params", "bf16", where=calibrated)
    assert t.source.startswith("calibrated reference/cpu/gloo/h32-f72") and "n=" in t.source


def test_variants_are_the_clean_seeded_case():
    case = _case("current", "grads_bf16_before_reduce")
    vs = on_demand.variants(case)
    assert [v.train.seed for v in vs] == list(range(1, 11))
    assert len({v.id for v in vs}) == 10 and all(v.scenario.startswith(on_demand.SCENARIO + "@")
                                                  for v in vs)
    for v in vs:
        assert v.ax["fault"] == "none" and v.ax["dcp"] == "sync" and v.numerics == case.numerics
        assert v.ax["seed"] == str(v.train.seed) and v.target == case.target
        assert set(v.checks) <= set(on_demand.CHECKS)


def _rows(values: dict, outcome="unjudged"):
    """A case's rows as a rank records them without a population: (check, quantity) ->
    (max_abs, rel_l2)."""
    rows = []
    for (check, quantity), (mx, rel) in values.items():
        for metric, v in (("max_abs", mx), ("rel_l2", rel)):
            rows.append(dict(phase="train" if check != "reshard" else "reshard", check=check,
                             quantity=quantity, metric=metric, value=v, tolerance=math.nan,
                             outcome=outcome, tolerance_source="unjudged",
                             detail="max_abs=1 (no tolerance), rel_l2=1 (no tolerance), 1/1 "
                             "elements differ [tolerance: unjudged]; unjudged: no population"))
    rows.append(dict(phase="train", check="fp32_parity", quantity="*", metric="coverage",
                     value=math.nan, tolerance=math.nan, outcome="passed", detail=""))
    return rows


def _measured(case, p99_rel=0.01, p99_abs=0.001, n=10):
    key = Population.of_case(case, "cpu", "gloo").key(("config", "module", "world_size"),
                                                      "fp32_parity")
    return {("fp32_parity", "params", case.recipe, "mse") + key + (m,):
            dict(n=n, p99=p, max=p) for m, p in (("max_abs", p99_abs), ("rel_l2", p99_rel))}


def test_unjudged_rows_are_judged_by_the_on_demand_population():
    case = _case()
    m = _measured(case)
    ok = _rows({("fp32_parity", "params"): (0.0015, 0.015)})
    assert on_demand.rejudge(case, ok, "cpu", "gloo", m, {}) == 0
    judged = [r for r in ok if r["metric"] == "rel_l2"][0]
    assert judged["outcome"] == "pass" and judged["tolerance"] == pytest.approx(0.02)
    assert judged["tolerance_source"].startswith("on demand reference/cpu/gloo/h36-f54")
    assert "(tol 0.02)" in judged["detail"] and "unjudged" not in judged["detail"]
    bad = _rows({("fp32_parity", "params"): (0.0015, 0.03)})  # 1.5x the tolerance
    assert on_demand.rejudge(case, bad, "cpu", "gloo", m, {}) == 0
    assert {r["outcome"] for r in bad if r["metric"] != "coverage"} == {"fail"}
    assert [r["outcome"] for r in bad if r["metric"] == "coverage"] == ["failed"]


def test_without_a_population_a_quantity_stays_unjudged():
    case = _case()
    rows = _rows({("fp32_parity", "params"): (0.0015, 0.015)})
    assert on_demand.rejudge(case, rows, "cpu", "gloo", {}, {}) == 1
    assert {r["outcome"] for r in rows if r["metric"] != "coverage"} == {"unjudged"}


def test_an_implausible_on_demand_population_is_not_taken():
    """A systematic error present while calibrating would calibrate itself: an on-demand p99
    over PLAUSIBLE_X times every packaged configuration's stays unjudged, with both numbers."""
    case = _case()
    packaged = _measured(dataclasses.replace(case, model=dataclasses.replace(case.model,
                                                                            hidden=40)))
    found = _measured(case, p99_rel=0.5)
    taken, refused = on_demand.screen(found, packaged)
    assert not taken and refused
    rows = _rows({("fp32_parity", "params"): (0.1, 0.4)})
    assert on_demand.rejudge(case, rows, "cpu", "gloo", {**packaged, **taken}, refused) == 1
    assert "over 10x the largest calibrated" in rows[0]["detail"]
    assert on_demand.screen(_measured(case, p99_rel=0.05), packaged)[0]  # 5x: taken
    # reduction-order noise moves by orders of magnitude with slices, steps and lr: not guarded
    twin_key = {("sharding_invariance",) + k[1:]: v for k, v in found.items()}
    assert on_demand.screen(twin_key, {("sharding_invariance",) + k[1:]: v
                                       for k, v in packaged.items()})[0] == twin_key


def test_a_rank_records_an_unjudged_comparison_not_a_failure():
    rec = Recorder()
    none = Tolerance.none_for("no population at h36-...")
    rec.compare("fp32_parity", "params", {"w": torch.ones(3)}, {"w": torch.ones(3) * 1.1}, none)
    assert {r["outcome"] for r in rec.rows} == {"unjudged"}
    assert "unjudged: no population" in rec.rows[0]["detail"]
    rec = Recorder()  # a structural mismatch fails whatever the tolerance
    rec.compare("fp32_parity", "params", {"w": torch.ones(3)}, {"w": torch.ones(4)}, none)
    assert {r["outcome"] for r in rec.rows} == {"fail"}
    # ... and says so, not that a tolerance is missing (no rejudging would change it)
    assert "fails whatever its tolerance" in rec.rows[0]["detail"]
    assert "no population" not in rec.rows[0]["detail"]
    rec = Recorder()
    nan = torch.tensor([1.0, math.nan])
    rec.compare("fp32_parity", "params", {"w": nan}, {"w": torch.ones(2)}, none)
    assert {r["outcome"] for r in rec.rows} == {"fail"}


def test_populations_from_variant_rows():
    case = _case()
    rows = []
    for v in on_demand.variants(case):
        res = [dict(phase="train", check="fp32_parity", quantity="params", metric=m,
                    value=0.01 * v.train.seed, outcome="unjudged", tolerance=math.nan)
               for m in ("max_abs", "rel_l2")]
        rows += on_demand.history_rows(v, res, "ok", "cpu", "gloo", "run1")
    got = on_demand.populations(rows)
    key = ("fp32_parity", "params", "bf16", "mse", "reference", "cpu", "gloo", case.numerics,
           "3", "LayerNormMLP", "rel_l2")
    assert got[key]["n"] == 10 and got[key]["max"] == pytest.approx(0.1)
    t = tolerances.lookup("fp32_parity", "params", "bf16", measured=got, train=case.train,
                          where=Population.of_case(case, "cpu", "gloo"), how="on demand")
    assert t.rel_l2 == pytest.approx(2 * got[key]["p99"])
    assert t.reason.startswith("on demand: 2x the p99") and "n=10" in t.source
    # one world's variants make no population of all world sizes
    assert not any("*" in (k[8], k[9]) for k in got)
    other = dataclasses.replace(Population.of_case(case, "cpu", "gloo"), world_size=4)
    with pytest.raises(MissingTolerance):
        tolerances.lookup("fp32_parity", "params", "bf16", measured=got, where=other)


def test_a_runs_own_delayed_twin_variants_make_a_population():
    """The rows of this run's variants carry no date, only the run id: TE DelayedScaling's twin
    samples are superseded before the fresh-amax build (derive.SUPERSEDED), but a run's own
    are measured now and make its population (they were dropped: unjudged on a GPU)."""
    from datetime import datetime, timedelta, timezone

    from harness.calibration import derive
    case = next(c for c in expand(load_scenario(SCENARIO.parent / "te_unseen_config.yaml"), "te")
                if c.recipe == "delayed" and c.ax["fault"] == "none" and c.ax["mesh"] == "dp4")
    run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-00042-abcdef012345"
    rows = []
    for v in on_demand.variants(case):
        res = [dict(phase="train", check="sharding_invariance", quantity="loss", metric=m,
                    value=1e-5 * v.train.seed, outcome="unjudged", tolerance=math.nan)
               for m in ("max_abs", "rel_l2")]
        rows += on_demand.history_rows(v, res, "ok", "cuda", "gloo", run_id)
    key = ("sharding_invariance", "loss", "delayed", "mse", "te", "cuda", "gloo", case.numerics,
           "4", "LayerNormMLP", "rel_l2")
    assert on_demand.populations(rows)[key]["n"] == 10
    earlier = datetime.fromisoformat(derive.SUPERSEDED[0][3]) - timedelta(hours=1)
    old = [dict(r, run_id=earlier.strftime("%Y%m%dT%H%M%S") + "-00042-abcdef012345")
           for r in rows]
    assert key not in on_demand.populations(old)


def test_a_registered_failure_is_never_sampled_nor_planned():
    """A strict failure a case's xfail entries name, or one of a producer a check needs, has no
    clean sample (the bug is in every variant): left out of the samples, judged by the entry."""
    from types import SimpleNamespace as NS
    fail = lambda check, quantity=None, strict=True: NS(check=check, quantity=quantity,
                                                       strict=strict)
    entries = [NS(fails=[fail("reshard", "next_params"), fail("fp32_parity", "loss", False)]),
               NS(fails=[fail("single_rank")])]
    out = on_demand.excluded(entries)
    assert out == {("reshard", "next_params"), ("sharding_invariance", None)}
    assert on_demand.excluded([NS(fails=[fail("train")])]) >= {(c, None) for c in
                                                                on_demand.CHECKS}
    rows = _rows({("reshard", "next_params"): (0.1, 0.05), ("fp32_parity", "params"): (1, 1)})
    assert on_demand.by_registry(rows, out) == 1
    got = {(r["check"], r["outcome"]) for r in rows if r["metric"] == "rel_l2"}
    assert got == {("reshard", "fail"), ("fp32_parity", "unjudged")}
    registered = [r for r in rows if r["check"] == "reshard"]
    for r in registered:  # the entry's bounds judge it: said so, with no bound of its own
        assert r["tolerance_source"] == "registered" and "[tolerance: registered]" in r["detail"]
        assert "(no tolerance)" in r["detail"] and "unjudged" not in r["detail"]


def test_a_detail_without_a_tolerance_says_so_never_tol_nan():
    from harness.calibration.tolerances import Tolerance
    from harness.checks.compare import Comparison
    c = Comparison(max_abs=0.5, rel_l2=0.25, n_diff=3, n_total=4, first_diff=None, problems=[])
    text = c.describe(Tolerance(math.nan, math.nan, "no population", source="unjudged"))
    assert text.startswith("max_abs=0.5 (no tolerance), rel_l2=0.25 (no tolerance), 3/4")
    assert "nan" not in text
    assert "(tol 0.001), rel_l2=0.25 (tol inf)" in c.describe(Tolerance(1e-3, math.inf, "x"))


def test_every_recipe_takes_min_n_variants_and_the_key_names_what_they_measure(monkeypatch):
    """TE DelayedScaling is bit-reproducible run to run since its builds start from fresh amax
    histories (backends/te_fresh_amax.py): its on-demand populations take MIN_N seeds like every
    recipe's. A cached population's key names what a variant measures (``VERSION``): one
    measured before a change of the harness's numerics is never taken after it."""
    from types import SimpleNamespace

    from harness.calibration.derive import MIN_N
    from harness.plugin.on_demand import OnDemand
    cases = expand(load_scenario(SCENARIO.parent / "te_unseen_config.yaml"), "te")
    pick = {r: next(c for c in cases if c.recipe == r and c.target is None)
            for r in ("delayed", "current")}
    hs = SimpleNamespace(config=SimpleNamespace(getoption=lambda name: "on", cache=None),
                         env=SimpleNamespace(describe=lambda: {"torch": "x"},
                                             placement=lambda case: ("gloo", None)),
                         device="cuda")
    for recipe, case in pick.items():
        od = OnDemand(hs)
        od.pools.packaged = {}  # nothing packaged: every calibrated quantity is measured
        planned = od.plan([(case, [])])
        assert planned and len({v.id for v in planned}) == len(planned)
        assert sorted({v.train.seed for v in planned}) == list(range(1, MIN_N + 1)), recipe
    od = OnDemand(hs)
    key = od._key(pick["delayed"], "gloo", frozenset())
    assert od._key(pick["current"], "gloo", frozenset()) != key
    monkeypatch.setattr(on_demand, "VERSION", on_demand.VERSION - 1)
    assert od._key(pick["delayed"], "gloo", frozenset()) != key


def test_a_changed_configuration_is_a_new_cache_key():
    """A user's scenario edited in place (same name, another lr or dims) must not hit the
    cached samples of the old configuration (their populations judge only the old one, and no
    variants would run): the variants' scenario name carries the configuration, and so does
    the key."""
    import dataclasses
    from types import SimpleNamespace

    from harness.plugin.on_demand import OnDemand
    case = expand(load_scenario(SCENARIO.parent / "te_unseen_config.yaml"), "te")[0]
    hs = SimpleNamespace(config=SimpleNamespace(getoption=lambda name: "on", cache=None),
                         env=SimpleNamespace(describe=lambda: {"torch": "x"},
                                             placement=lambda case: ("gloo", None)),
                         device="cuda")
    od = OnDemand(hs)
    key = od._key(case, "gloo", frozenset())
    other_lr = dataclasses.replace(case, train=dataclasses.replace(case.train,
                                                                   lr=case.train.lr * 3))
    other_dims = dataclasses.replace(case, model=dataclasses.replace(case.model,
                                                                     hidden=case.model.hidden * 2))
    assert od._key(other_lr, "gloo", frozenset()) != key
    assert od._key(other_dims, "gloo", frozenset()) != key
    assert od._key(dataclasses.replace(case), "gloo", frozenset()) == key  # the same: a hit


def test_a_refusal_at_another_configuration_gives_no_reason_here():
    """A population refused at one configuration names its reason for that configuration's
    cases only: a case elsewhere missing the same quantity says why it is missing there
    (refusals were remembered by check, quantity, recipe and loss alone)."""
    case = _case()
    other = dataclasses.replace(case, model=dataclasses.replace(case.model, hidden=40))
    packaged = _measured(dataclasses.replace(case, model=dataclasses.replace(case.model,
                                                                            hidden=48)))
    _, refused = on_demand.screen(_measured(other, p99_rel=0.5), packaged)
    assert refused
    rows = _rows({("fp32_parity", "params"): (0.1, 0.4)})
    assert on_demand.rejudge(case, rows, "cpu", "gloo", packaged, refused) == 1
    assert "over 10x" not in rows[0]["detail"] and "unjudged: " in rows[0]["detail"]
