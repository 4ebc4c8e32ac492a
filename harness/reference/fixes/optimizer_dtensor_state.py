"""TE #2795: optimizer states are DTensors with their param's mesh and placements.

Before the fix FusedAdam kept ``exp_avg`` / ``exp_avg_sq`` / master weights as plain local
tensors even for DTensor params. DCP then sees each rank's local shard as a whole,
unsharded tensor: saves deduplicate the "replicas" (ranks load another rank's values) and a
4 -> 2 reshard fails with "Size mismatch between saved torch.Size([64]) and current:
torch.Size([128]) for optim.state.<param>.exp_avg".
"""

from torch.distributed.tensor import DTensor

from harness.reference.fixes import on

NAME = "optimizer_dtensor_state"


def wrap(local, param):
    """The state tensor as stored: a DTensor like ``param`` (fixed) or the local tensor."""
    if on(NAME) and isinstance(param, DTensor):
        return DTensor.from_local(local, param.device_mesh, param.placements,
                                  shape=param.shape, stride=param.stride(), run_check=False)
    return local


def local(state):
    return state._local_tensor if isinstance(state, DTensor) else state
