"""A GPU per rank over NCCL: world-2 TE cases run to the end (skips with fewer than 2 GPUs or
without TE).

With ``device_id`` bound (the worker's NCCL launches) a new NCCL group is a split of the
launch's communicator that every rank must join; the sharding_invariance twin's one-rank group,
made by rank 0 alone, waited there for good in every world-2 launch of a 2x H100 run
(2026-11-27: no case of the world-2 half ran in 400 s). These cases run the twin (bf16, Float8
current scaling: the recipes it stands for on two slices) under ``--gpu-share never``, in a
subprocess bounded as a user's run would be.
"""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.backends import get
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
CASES = ["bf16-dp2-Linear-sync-none", "current-dp2-LayerNormMLP-async_thread-none"]


def _skip_reason():
    import torch
    if torch.cuda.device_count() < 2:
        return f"needs 2 CUDA GPUs (a GPU per rank over NCCL); {torch.cuda.device_count()} here"
    cases = expand(load_scenario(ROOT / "scenarios" / "fsdp2_tp_dcp.yaml"), "te")
    return get("te").skip_reason(cases[0], "cuda")


@pytest.fixture(scope="module")
def nccl_run(tmp_path_factory):
    why = _skip_reason()
    if why:
        pytest.skip(why)
    out = tmp_path_factory.mktemp("nccl")
    cmd = [sys.executable, "-m", "pytest", "-p", "harness.plugin", "-q", "-p", "no:cacheprovider",
           "--scenario", "fsdp2_tp_dcp", "--backend", "te", "--gpu-share", "never",
           "--case-timeout", "120", "-k", " or ".join(CASES), "--report-dir", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"})
    summary = pd.read_csv(next(out.glob("runs/*/summary.csv")))
    history = pd.read_parquet(next(out.glob("history/*.parquet")))
    return proc, summary, history


def test_world_2_cases_pass_on_nccl_with_their_one_rank_twin(nccl_run):
    proc, summary, history = nccl_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(summary.case_id) == sorted(f"fsdp2_tp_dcp[{c}]" for c in CASES)
    assert set(summary.pg_backend) == {"nccl"} and set(summary.ranks_per_gpu) == {1}
    assert set(summary.case_outcome) == {"passed"}, summary[["case_id", "case_outcome"]]
    twin = history[(history.check == "sharding_invariance") & history.row_outcome.eq("pass")]
    assert set(twin.case_id) == set(summary.case_id), "the twin did not run in every case"
