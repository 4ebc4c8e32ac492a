"""Workaround ``current_scale_group``: Float8CurrentScaling weight shards quantized from the
initial full weights with ONE scale -- the amax of the whole weight, over the FSDP shard group.

What it works around (TE 2.20.2, found by sharding_invariance; see the te_workarounds entry of
scenarios/xfails.yaml): a weight shard's scale is reduced over the shard group only once the
tensor carries a tensor-level ``amax_reduction_group``, which TE's ``fsdp_pre_all_gather`` sets
on the first all-gather. Values copied into the shards before it -- the initial weights through
``set_model_state_dict``, a checkpoint loaded into a fresh model -- are quantized with each
shard's own amax, while the all-gather rebuilds the whole weight with the gathering rank's
``scale_inv``: the other shards' FP8 bytes are read at the wrong scale. The workaround sets the
tensor-level group of every current-scaling weight shard of an FSDP-only mesh right after the
build, as the first all-gather would. (FSDP2 x TP weights take their group from the #2713 port,
``te_tp/amax_group.py``.)
"""

from __future__ import annotations

from torch.distributed.tensor import DTensor

from harness.spec.mesh import SHARD, TP

NAME = "current_scale_group"
WHY = ("current-scaling weight shards get their tensor-level amax group (the FSDP shard group) "
       "right after the build: before the first all-gather sets it, TE quantizes values copied "
       "into a shard (the initial weights, a checkpoint load) with the shard's own amax")


def apply(model, names: dict | None = None) -> int:
    """Set the FSDP shard group on each current-scaling weight shard that has none; returns
    how many it set. ``names``: the backend's mesh dim names (``mesh_names``; None: the
    harness's own)."""
    shard_dim, tp_dim = ((names or {}).get(d, d) for d in (SHARD, TP))
    n = 0
    for p in model.parameters():
        if not isinstance(p, DTensor):
            continue
        t = p._local_tensor
        if type(getattr(t, "_quantizer", None)).__name__ != "Float8CurrentScalingQuantizer":
            continue
        if getattr(t, "amax_reduction_group", None) is not None:
            continue
        mesh = p.device_mesh
        dims = mesh.mesh_dim_names or ()
        if mesh.ndim == 1:
            group = mesh.get_group()
        elif shard_dim in dims and len(dims) == 2 and tp_dim not in dims:
            group = mesh.get_group(shard_dim)
        else:
            continue  # tensor parallel: the port's weight group
        t.amax_reduction_group = group
        n += 1
    return n
