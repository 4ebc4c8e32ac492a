"""TP twins of different sizes in one launch (tests/scenarios/tp_twin_order.yaml): the second
twin's group is agreed by every rank, so dp2xtp3 after dp3xtp2 runs instead of waiting out the
timeout in single_rank (a QA probe's finding on real TE, 2026-11-29: 130-210 s, then a crash
naming every rank in single_rank; on CPU the same at 60 s)."""

import subprocess
import sys

import pytest
from forked import FORK

from unseen import ROOT, cases

pytestmark = pytest.mark.integration


def test_a_three_rank_tp_twin_after_a_two_rank_one_runs(tmp_path):
    import pandas as pd
    p = subprocess.run([sys.executable, "-m", "pytest", "--scenario",
                        str(ROOT / "tests" / "scenarios" / "tp_twin_order.yaml"), "--backend",
                        "reference", "--calibrate", "off", "--report-dir",
                        str(tmp_path / "report"), "-q", "-p", "no:randomly", "-o",
                        f"cache_dir={tmp_path / 'cache'}", *FORK],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = p.stdout[-3000:] + p.stderr[-2000:]
    files = sorted((tmp_path / "report" / "history").glob("*.parquet"))
    assert files, out
    df = pd.concat([pd.read_parquet(f) for f in files])
    assert cases(df) == {"tp_twin_order[delayed-dp3xtp2-LayerNormMLP-sync-none]": "passed",
                         "tp_twin_order[delayed-dp2xtp3-LayerNormMLP-sync-none]": "passed"}, out
    twin = df[(df["check"] == "sharding_invariance") & (df["metric"] == "max_abs")]
    assert set(twin["case_id"]) == set(cases(df)), out  # both twins ran and were compared
