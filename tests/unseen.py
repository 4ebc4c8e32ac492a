"""What the unseen-configuration tests share (tests/scenarios/unseen_config.yaml, a
configuration no calibration ran): a run as a user starts it, in a results store and a pytest
cache of its own, and what every clean case's rows must show."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
from forked import FORK

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "tests" / "scenarios" / "unseen_config.yaml"
CONFIG = {"fp32": "h36-f54-a4-s5-b12-o30-L2-v128-st5-lr0.003",
          "block": "h256-f512-a4-s5-b12-o256-L2-v128-st5-lr0.003",
          "mxfp8": "h192-f384-a4-s5-b12-o192-L2-v128-st5-lr0.003"}


def run(tmp: Path, backend: str, *args: str) -> tuple[int, str, pd.DataFrame]:
    """``pytest --scenario unseen_config --backend BACKEND ARGS`` with ``tmp``'s results store
    and cache, its ranks forked from its rank server: (exit code, output, this run's
    history)."""
    report = tmp / "report"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    p = subprocess.run([sys.executable, "-m", "pytest", "--scenario", str(SCENARIO), "--backend",
                        backend, "--report-dir", str(report), "-o", f"cache_dir={tmp / 'cache'}",
                        "-q", "-p", "no:randomly", *FORK, *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1500)
    files = sorted((report / "history").glob("*.parquet"))
    df = pd.concat([pd.read_parquet(f) for f in files]) if files else pd.DataFrame()
    for f in files:  # the next run of this cache dir reads only its own history
        f.unlink()
    return p.returncode, p.stdout + p.stderr, df


def cases(df: pd.DataFrame) -> dict[str, str]:
    return df.groupby("case_id")["case_outcome"].first().to_dict()


def calibrated(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of the calibrated comparisons (the bitwise reshard state left out)."""
    return df[df["metric"].isin(["max_abs", "rel_l2"])
              & df["check"].isin(["fp32_parity", "sharding_invariance", "reshard"])
              & ~df["quantity"].isin(["state"])]


def assert_clean_cases_pass_on_demand(result, want: int) -> None:
    """Every clean case passed, each calibrated quantity by an on-demand population of its own
    configuration (never unjudged, never ``tol nan``); reshards by their own edge's."""
    rc, out, df = result
    clean = df[df["axes"].str.contains('"fault": "none"')]
    outcomes = cases(clean)
    assert len(outcomes) == want and set(outcomes.values()) == {"passed"}, (outcomes, out[-3000:])
    rows = calibrated(clean)
    rows = rows[rows["tolerance_source"] != "bitwise"]
    assert len(rows) > 10 and not (rows["row_outcome"] == "unjudged").any()
    for recipe, src, config in zip(rows["recipe"], rows["tolerance_source"], rows["config"]):
        assert src.startswith("on demand ") and f"/{config}/" in src, (recipe, src)
        assert config == CONFIG.get(recipe, CONFIG["mxfp8" if recipe == "nvfp4" else "fp32"])
    edges = {s.split("/")[4] for s in rows[rows["check"] == "reshard"]["tolerance_source"]}
    assert edges and edges <= {"3->2", "2->3", "6->4"}, edges
    assert "calibrated on demand:" in out and "tol nan" not in out
