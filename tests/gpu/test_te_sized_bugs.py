"""The sized bugs fail their checks on real TransformerEngine too (GPU; skips without it).

Run on the GPU machine: ``pytest tests/gpu`` (TE importable, CUDA with >= 2 GPUs).
"""

from pathlib import Path

import pytest

from harness.backends import get
from harness.launcher import Launcher
from harness.matrix import expand
from harness.scheduler import Scheduler
from harness.spec import load_scenario

pytestmark = pytest.mark.integration
SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "te_sized_bugs.yaml"


def _skip_reason():
    import torch
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return "needs 2 CUDA GPUs"
    te = get("te")
    cases = expand(load_scenario(SCENARIO), "te")
    return te.skip_reason(cases[0], "cuda")


@pytest.fixture(scope="module")
def sized(tmp_path_factory):
    why = _skip_reason()
    if why:
        pytest.skip(why)
    import torch
    cases = expand(load_scenario(SCENARIO), "te")
    root = tmp_path_factory.mktemp("te_sized")
    gpus = [str(i) for i in range(torch.cuda.device_count())]
    with Scheduler(Launcher(root / "launches", "te", "cuda", gpus=gpus, launches_per_gpu=3),
                   cases, root / "ckpt") as sched:
        return {(c.recipe, c.ax["fault"]): sched.result(c) for c in cases}


def _fails(res, check, quantity) -> bool:
    return any(r["outcome"] == "fail" for r in res.rows
               if (r["check"], r["quantity"]) == (check, quantity))


@pytest.mark.parametrize("recipe", ["bf16", "current", "block"])
def test_te_sized_bugs_fail_their_checks(sized, recipe):
    for fault in ("lr_scale_1.5", "lr_scale_0.67"):
        assert _fails(sized[(recipe, fault)], "fp32_parity", "update_norms"), (recipe, fault)
    assert _fails(sized[(recipe, "wrong_scale")], "fp32_parity", "loss")
    drop = sized[(recipe, "drop_exp_avg")]
    assert _fails(drop, "dcp_roundtrip", "state")
    if recipe != "block":  # block scaling cannot reshard onto hsdp2x1 (a registered TE bug)
        assert _fails(drop, "reshard", "next_params")
    clean = sized[(recipe, "none")]
    assert clean.passed, [(r["check"], r["quantity"], r["detail"]) for r in clean.failed_rows]
