"""The torch backend at a configuration no calibration ran (tests/scenarios/unseen_config.yaml):
reshards 2 -> 3 and 6 -> 4 pass by on-demand populations of their own edges; a second run takes
the populations from pytest's cache; with ``--calibrate off`` the quantities are unjudged --
recorded with the reason, no failure and no ``tol nan`` -- and the run is not green."""

import pytest

from unseen import assert_clean_cases_pass_on_demand, calibrated, cases, run

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("unseen_torch")
    return {"first": run(tmp / "torch", "torch"),
            "again": run(tmp / "torch", "torch", "-k", "fp32 and dp2 and to_dp3"),
            "off": run(tmp / "off", "torch", "-k", "fp32 and dp2", "--calibrate", "off")}


def test_reshards_to_new_edges_pass_by_their_own_populations(runs):
    assert_clean_cases_pass_on_demand(runs["first"], want=2)


def test_a_second_run_takes_the_populations_from_the_cache(runs):
    rc, out, df = runs["again"]
    assert rc == 0, out[-3000:]
    assert "calibrated on demand:" not in out and "from the cache of an earlier run" in out
    assert calibrated(df)["tolerance_source"].str.startswith("on demand ").any()
    assert set(cases(df).values()) == {"passed"}


def test_without_calibration_the_quantities_are_unjudged_and_the_run_is_not_green(runs):
    rc, out, df = runs["off"]
    assert rc == 1 and "unjudged:" in out and "not green" in out, out[-3000:]
    rows = calibrated(df)
    unjudged = rows[rows["row_outcome"] == "unjudged"]
    assert len(unjudged) and (unjudged["tolerance_source"] == "unjudged").all()
    assert unjudged["detail"].str.contains("--calibrate off").all()
    assert unjudged["detail"].str.contains("(no tolerance)", regex=False).all()
    assert not (rows["row_outcome"] == "fail").any()  # unjudged is no failure ...
    assert "tol nan" not in out  # ... and no NaN-tolerance verdict
