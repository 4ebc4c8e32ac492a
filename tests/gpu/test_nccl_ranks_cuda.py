"""A GPU per rank over NCCL: world-2 TE cases run to the end (skips with fewer than 2 GPUs or
without TE).

With ``device_id`` bound (the worker's NCCL launches) a new NCCL group is a split of the
launch's communicator that every rank must join; the sharding_invariance twin's one-rank group,
made by rank 0 alone, waited there for good in every world-2 launch (no case of the world-2
half ran). These cases run the twin (bf16, Float8 current scaling: the recipes it stands for on
two slices) under ``--gpu-share never``, in a subprocess bounded as a user's run would be.
"""

import pytest

pytestmark = pytest.mark.integration
CASES = ["bf16-dp2-Linear-sync-none", "current-dp2-LayerNormMLP-async_thread-none"]


@pytest.fixture(scope="module")
def nccl_run(require_te, run_matrix):  # tests/gpu/conftest.py
    require_te(gpus=2)  # a GPU per rank over NCCL
    return run_matrix("nccl", CASES, "--gpu-share", "never", "--case-timeout", "120",
                         timeout_s=400)


def test_world_2_cases_pass_on_nccl_with_their_one_rank_twin(nccl_run):
    proc, summary, history = nccl_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(summary.case_id) == sorted(f"fsdp2_tp_dcp[{c}]" for c in CASES)
    assert set(summary.pg_backend) == {"nccl"} and set(summary.ranks_per_gpu) == {1}
    assert set(summary.case_outcome) == {"passed"}, summary[["case_id", "case_outcome"]]
    twin = history[(history.check == "sharding_invariance") & history.row_outcome.eq("pass")]
    assert set(twin.case_id) == set(summary.case_id), "the twin did not run in every case"
