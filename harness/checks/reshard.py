"""reshard: the checkpoint loaded on another mesh (another world size).

The loaded state equals *S* bit for bit wherever it does not depend on the mesh (full tensors;
quantized tensors as their raw parts, gathered), and one step on the target mesh lands within
the recipe's tolerance of the uninterrupted run's next step (other shard shapes reduce in
another order, so not bitwise).
"""

from __future__ import annotations

from harness.calibration import tolerances
from harness.checks.base import Check
from harness.checks.parity import losses, tol
from harness.distributed.run import mesh_independent


def reshard(art, rec) -> None:
    case, run, exp = art.case, art["resharded"], art["expected"]
    rec.compare("reshard", "state", mesh_independent(run.full_state()),
                mesh_independent(exp.state), tolerances.BITWISE)
    loss, _ = run.step(case.train.steps)
    rec.compare("reshard", "next_loss", losses([loss]), losses([exp.next_loss]),
                tol(art, "reshard", "next_loss"))
    rec.compare("reshard", "next_params", run.full_params(), exp.next_params,
                tol(art, "reshard", "next_params"))


CHECK = Check("reshard", ("resharded", "expected"), reshard, phase="reshard")
