"""The multi-node launch path (torchrun c10d rendezvous), on CPU as 2 simulated nodes on
localhost; and the command a node launcher such as srun gets."""

from pathlib import Path

import pytest

from harness.launch.launcher import Launcher
from harness.launch.scheduler import Scheduler
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent


def test_node_launcher_gets_one_agent_command(tmp_path):
    launcher = Launcher(tmp_path, "te", "cuda", nnodes=2, rdzv_endpoint="head:29500",
                        node_launcher=["srun", "--nodes=2", "--ntasks-per-node=1"])
    (argv,) = launcher.commands(tmp_path / "plan.json", 16, "L001")
    assert argv[:3] == ["srun", "--nodes=2", "--ntasks-per-node=1"]
    assert "--nnodes=2" in argv and "--nproc-per-node=8" in argv
    assert "--rdzv-backend=c10d" in argv and "--rdzv-endpoint=head:29500" in argv
    assert "--standalone" not in argv and argv[-2:] == ["--plan", str(tmp_path / "plan.json")]


def test_world_must_split_over_nodes(tmp_path):
    with pytest.raises(ValueError, match="does not split over 3 nodes"):
        Launcher(tmp_path, "torch", "cpu", nnodes=3).commands(tmp_path / "p", 4, "L001")


@pytest.mark.integration
def test_two_simulated_nodes_run_a_4_rank_case(tmp_path):
    case = next(c for c in expand(load_scenario(ROOT / "scenarios" / "smoke.yaml"))
                if c.label == "fp32-dp2xtp2-MultiheadAttention-async_thread-none")
    launcher = Launcher(tmp_path / "launches", "torch", "cpu", nnodes=2)
    with Scheduler(launcher, [case], tmp_path / "ckpt") as sched:
        res = sched.result(case)
    assert res.passed, (res.errors, res.failed_rows)
    assert {r["check"] for r in res.rows} >= {"fp32_parity", "dcp_roundtrip", "async_equivalence"}
    (plan_dir,) = (tmp_path / "launches").iterdir()
    assert sorted(p.name for p in (plan_dir / "logs").iterdir()) == [f"rank{r}.log" for r in range(4)]
