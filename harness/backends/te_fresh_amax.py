"""A built TE model's DelayedScaling state made fresh before the initial weights go in.

The build (``TEBackend.build``) lets TE's ``reset_parameters`` draw random weights, quantizes
them -- recording their amax in the weight quantizer's row of ``amax_history`` -- and then
copies the reference's weights in, whose quantization max-accumulates into that same row. The
history kept the amax of weights no model holds any more, drawn from whatever state the
process's CUDA generator was in: the first DelayedScaling scale update then used it, so the
twin and the sharded run were not reproducible run to run (docs/findings.md). Zeroing every
DelayedScaling amax history (scales back to 1) after TE's initialisation and before the copy
leaves in it the amax of the weights the run starts from -- on every rank its shard's, reduced
over the group by the first update -- as in a model built from those weights.
"""

from __future__ import annotations

import torch


def _states(module) -> list:
    """The DelayedScaling recipe states of ``module``: a TE module's ``fp8_meta`` entries and a
    te.ops operation's ``_fp8_metas`` per mode -- objects holding ``amax_history`` and
    ``scale`` tensors."""
    found = []
    metas = [getattr(module, "fp8_meta", None)]
    ops = getattr(module, "_fp8_metas", None)
    if isinstance(ops, dict):
        metas += list(ops.values())
    for meta in metas:
        if not isinstance(meta, dict):
            continue
        for state in meta.values():
            if isinstance(getattr(state, "amax_history", None), torch.Tensor) and \
                    isinstance(getattr(state, "scale", None), torch.Tensor):
                found.append(state)
    return found


@torch.no_grad()
def reset(model) -> int:
    """Every DelayedScaling amax history of ``model`` zeroed and its scales set to 1, in place
    (the tensors TE's global buffers may view stay the same objects); returns how many recipe
    states it reset."""
    n = 0
    for m in model.modules():
        for state in _states(m):
            state.amax_history.zero_()
            state.scale.fill_(1.0)
            n += 1
    return n
