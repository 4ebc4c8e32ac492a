"""A user's own configuration, end to end (tests/scenarios/unseen_config.yaml): world sizes 3
and 6, dims that are not multiples of 8, 5 steps at lr 3e-3, seed 7, reshards 3 -> 2, 2 -> 3 and
6 -> 4 -- configurations no calibration ran. Every calibrated quantity is judged by a population
measured on demand for its configuration (never borrowed, never ``tol nan``): every clean case
passes, every sized bug fails; a second run takes the populations from the cache; with
``--calibrate off`` the quantities are unjudged and the run is not green."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "tests" / "scenarios" / "unseen_config.yaml"
CONFIG = {"fp32": "h36-f54-a4-s5-b12-o30-L2-v128-st5-lr0.003",
          "block": "h256-f512-a4-s5-b12-o256-L2-v128-st5-lr0.003",
          "mxfp8": "h192-f384-a4-s5-b12-o192-L2-v128-st5-lr0.003"}
CAUGHT_BY = {"lr_scale_1.5": {("fp32_parity", "update_norms")},
             "frozen_weights": {("fp32_parity", "update_norms"), ("fp32_parity", "params_updated")},
             "grads_bf16": {("sharding_invariance", "grads")},
             "grads_bf16_before_reduce": {("sharding_invariance", "grads")}}


def _run(tmp: Path, backend: str, *args: str) -> tuple[int, str, pd.DataFrame]:
    report = tmp / "report"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    p = subprocess.run([sys.executable, "-m", "pytest", "--scenario", str(SCENARIO), "--backend",
                        backend, "--report-dir", str(report), "-o", f"cache_dir={tmp / 'cache'}",
                        "-q", "-p", "no:randomly", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1500)
    files = sorted((report / "history").glob("*.parquet"))
    df = pd.concat([pd.read_parquet(f) for f in files]) if files else pd.DataFrame()
    for f in files:  # the next run of this cache dir reads only its own history
        f.unlink()
    return p.returncode, p.stdout + p.stderr, df


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("unseen")
    return {"reference": _run(tmp / "ref", "reference"), "torch": _run(tmp / "torch", "torch"),
            "torch_again": _run(tmp / "torch", "torch", "-k", "fp32 and dp2 and to_dp3"),
            "off": _run(tmp / "off", "torch", "-k", "fp32 and dp2", "--calibrate", "off")}


def _cases(df: pd.DataFrame) -> dict[str, str]:
    return df.groupby("case_id")["case_outcome"].first().to_dict()


def _calibrated(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["metric"].isin(["max_abs", "rel_l2"])
              & df["check"].isin(["fp32_parity", "sharding_invariance", "reshard"])
              & ~df["quantity"].isin(["state"])]


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_every_clean_case_passes_by_a_tolerance_of_its_own_configuration(runs, backend):
    rc, out, df = runs[backend]
    clean = df[df["axes"].str.contains('"fault": "none"')]
    outcomes = _cases(clean)
    want = {"reference": 7, "torch": 2}[backend]  # every recipe; torch: 2 -> 3, 6 -> 4
    assert len(outcomes) == want and set(outcomes.values()) == {"passed"}, (outcomes, out[-3000:])
    rows = _calibrated(clean)
    rows = rows[rows["tolerance_source"] != "bitwise"]
    assert len(rows) > 20 and not (rows["row_outcome"] == "unjudged").any()
    for recipe, src, config in zip(rows["recipe"], rows["tolerance_source"], rows["config"]):
        assert src.startswith("on demand ") and f"/{config}/" in src, (recipe, src)
        assert config == CONFIG.get(recipe, CONFIG["mxfp8" if recipe == "nvfp4" else "fp32"])
    assert {"3->2", "2->3", "6->4"} >= {s.split("/")[4] for s in rows[rows["check"] == "reshard"]
                                        ["tolerance_source"]}
    assert "calibrated on demand:" in out and "tol nan" not in out


def test_every_sized_bug_fails_on_every_recipe(runs):
    _, out, df = runs["reference"]
    bugs = df[~df["axes"].str.contains('"fault": "none"')]
    outcomes = _cases(bugs)
    assert len(outcomes) == 7 * len(CAUGHT_BY), out[-3000:]
    assert set(outcomes.values()) == {"failed"}, outcomes
    failed = bugs[bugs["row_outcome"] == "fail"]
    for (case, fault), g in failed.groupby(["case_id", failed["axes"].str.extract(
            r'"fault": "([^"]+)"')[0]]):
        caught = set(zip(g["check"], g["quantity"]))
        assert caught & CAUGHT_BY[fault], (case, sorted(caught))


def test_a_second_run_takes_the_populations_from_the_cache(runs):
    rc, out, df = runs["torch_again"]
    assert rc == 0, out[-3000:]
    assert "calibrated on demand:" not in out and "from the cache of an earlier run" in out
    rows = _calibrated(df)
    assert rows["tolerance_source"].str.startswith("on demand ").any()
    assert set(_cases(df).values()) == {"passed"}


def test_without_calibration_the_quantities_are_unjudged_and_the_run_is_not_green(runs):
    rc, out, df = runs["off"]
    assert rc == 1 and "unjudged:" in out and "not green" in out, out[-3000:]
    rows = _calibrated(df)
    unjudged = rows[rows["row_outcome"] == "unjudged"]
    assert len(unjudged) and (unjudged["tolerance_source"] == "unjudged").all()
    assert unjudged["detail"].str.contains("--calibrate off").all()
    assert not (rows["row_outcome"] == "fail").any()  # unjudged is no failure ...
    assert "tol nan" not in out  # ... and no NaN-tolerance verdict
