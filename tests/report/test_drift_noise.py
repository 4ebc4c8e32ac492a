"""Drift of series that are not bit-reproducible run to run (harness/report/drift_noise.py):
their noise alone flags nothing, a shift of their whole group does, and reproducible series
keep the point rules (tests/report/test_history_drift.py)."""

import numpy as np
from synth_history import make_case, write_run

from harness.report import drift, history

NOISY = ("sharding_invariance", "loss", "max_abs")
CASES = [dict(recipe="delayed", mesh=m, module=mod, dcp="sync", reshard="none")
         for m in ("dp2", "dp4") for mod in ("Linear", "LayerNormMLP", "TransformerLayer")]
TOL = 1e-2


def _history(report_dir, last_scale: dict[int, float], runs: int = 7):
    """``runs`` runs of the 6 CASES, each value 1e-4 times a log-uniform factor of 1/10..10
    drawn afresh every run (the run-to-run noise of TE DelayedScaling's twin loss); the last
    run's value of case i times ``last_scale.get(i, 1)``."""
    rng = np.random.default_rng(7)
    for n in range(runs):
        cases = []
        for i, ax in enumerate(CASES):
            v = 1e-4 * 10 ** rng.uniform(-1, 1)
            if n == runs - 1:
                v *= last_scale.get(i, 1.0)
            cases.append(make_case(ax, metrics={NOISY: (v, TOL)}))
        write_run(report_dir, n, cases)
    return history.load(report_dir / "history")


def test_noise_alone_flags_nothing(report_dir):
    h = _history(report_dir, {})
    res = drift.detect(h)
    latest = res.latest
    assert latest["noisy"].all() and (latest["base_n"] == 5).all()
    # judged point by point, the noise alone would be drift: a series grew beyond 4x
    ratios = latest["value"] / latest["base_median"]
    assert ratios.max() > 4 and res.flags.empty, ratios.describe()


def test_a_shift_of_the_group_is_flagged(report_dir):
    h = _history(report_dir, {i: 20.0 for i in range(len(CASES))})
    res = drift.detect(h)
    assert len(res.flags) >= 4, res.latest[["value", "base_median", "group_growth"]]
    assert (res.flags["group_growth"] > 4).all()
    assert all("its group (not bit-reproducible run to run) grew" in r
               for r in res.flags["reason"])


def test_one_noisy_series_jumping_alone_is_its_verdicts_business(report_dir):
    """A 20x jump of one series of a noisy group is not drift (its group did not move); the
    case's own tolerance still judges it."""
    h = _history(report_dir, {0: 20.0})
    res = drift.detect(h)
    assert res.flags.empty and res.latest["noisy"].all()


def test_a_steady_series_keeps_the_point_rules(report_dir):
    """Reproducible series (every run the same value) stay judged point by point: a 10x jump
    of one of them is flagged."""
    for n in range(7):
        v = 1e-4 * (10 if n == 6 else 1)
        write_run(report_dir, n, [make_case(ax, metrics={NOISY: (v if i == 0 else 1e-4, TOL)})
                                  for i, ax in enumerate(CASES)])
    res = drift.detect(history.load(report_dir / "history"))
    assert not res.latest["noisy"].any()
    assert len(res.flags) == 1 and "grew 10x" in res.flags.iloc[0]["reason"]
