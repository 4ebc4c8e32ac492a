"""Sharding invariance under tensor parallelism (tests/scenarios/tp_twin.yaml): the twin keeps
the TP split, so on CPU over two data-parallel slices it is bitwise for every reference recipe
-- bf16, Float8CurrentScaling and NVFP4 included, whose TP partial sums a twin without TP does
not share -- and gradients rounded to bf16 on their way into the reduce-scatter fail it."""

import subprocess
import sys

import pandas as pd
import pytest
from forked import FORK

from unseen import ROOT, cases

pytestmark = pytest.mark.integration
RECIPES = 7


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tp_twin")
    p = subprocess.run([sys.executable, "-m", "pytest", "--scenario",
                        str(ROOT / "tests" / "scenarios" / "tp_twin.yaml"), "--backend",
                        "reference", "--report-dir", str(tmp / "report"), "-q", "-p",
                        "no:randomly", "-o", f"cache_dir={tmp / 'cache'}", *FORK],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    files = sorted((tmp / "report" / "history").glob("*.parquet"))
    assert files, p.stdout[-3000:] + p.stderr[-3000:]
    df = pd.concat([pd.read_parquet(f) for f in files])
    return p.stdout + p.stderr, df[df["check"] == "sharding_invariance"]


def test_every_clean_tp_case_is_bitwise_against_its_twin(result):
    out, df = result
    clean = df[df["axes"].str.contains('"fault": "none"')]
    assert set(cases(clean).values()) == {"passed"} and len(cases(clean)) == RECIPES, out[-3000:]
    metrics = clean[clean["metric"].isin(["max_abs", "rel_l2"])]
    assert set(metrics["quantity"]) >= {"loss", "grads", "params"}
    assert (metrics["tolerance"] == 0).all() and (metrics["value"] == 0).all()
    assert set(metrics["tolerance_source"]) == {"bitwise"}


def test_grads_rounded_before_the_reduce_fail_on_every_recipe(result):
    out, df = result
    bugs = df[df["axes"].str.contains('"fault": "grads_bf16_before_reduce"')]
    assert set(cases(bugs).values()) == {"failed"} and len(cases(bugs)) == RECIPES, out[-3000:]
    failed = bugs[(bugs["row_outcome"] == "fail") & (bugs["quantity"] == "grads")]
    assert set(failed["case_id"]) == set(bugs["case_id"])
    assert (failed[failed["metric"] == "rel_l2"]["value"] > 1e-4).all()
