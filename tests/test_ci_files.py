"""The nightly GPU workflow and the Slurm script stay consistent with the scenarios."""

from pathlib import Path

import yaml

from harness.matrix import expand
from harness.spec import load_scenario

ROOT = Path(__file__).resolve().parent.parent


def test_nightly_workflow_shards_every_te_world_size():
    wf = yaml.safe_load((ROOT / "ci" / "nightly-gpu.yml").read_text())
    gpu = wf["jobs"]["gpu"]
    worlds = {m["world"] for m in gpu["strategy"]["matrix"]["include"]}
    needed = set()
    for name in ("fsdp2_tp_dcp", "te_fused_adam"):
        needed |= {max(c.world_sizes) for c in expand(load_scenario(ROOT / "scenarios" / f"{name}.yaml"), "te")}
    assert needed <= worlds, f"no GPU runner for world sizes {needed - worlds}"
    run = "\n".join(step.get("run", "") for step in gpu["steps"])
    assert "--world-size ${{ matrix.world }}" in run and "--backend te" in run
    report = "\n".join(step.get("run", "") for step in wf["jobs"]["report"]["steps"])
    assert "harness report" in report and "harness drift" in report and "--fail-on-drift" in report
    for var in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        assert var in gpu["env"]


def test_slurm_script_uses_the_multinode_options():
    text = (ROOT / "ci" / "slurm" / "nightly_multinode.sbatch").read_text()
    for opt in ("--nnodes", "--rdzv-endpoint", "--node-launcher", "--work-dir", "srun"):
        assert opt in text
