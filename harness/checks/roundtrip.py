"""Checkpoint checks on the case's own mesh.

dcp_roundtrip
    The fresh model + optimizer loaded from the checkpoint holds *S* -- every tensor, every raw
    buffer of a quantized tensor (rowwise / columnwise data, transposes, scales, amax) -- bit for
    bit; and its next step equals the uninterrupted run's next step bit for bit. Buffers the
    backend declares lazily rebuilt (``backend.lazy_buffers``: TE's transpose caches and
    columnwise copies) are compared on their own: where both sides hold them after the load
    (``cached_buffers``), and all of them after that next step, with the uninterrupted run's
    (``rebuilt_buffers``): a cache the load lost or left stale shows there.
async_equivalence
    The async checkpoint, read back from disk chunk by chunk, holds the same bytes as a sync
    checkpoint of the same state (``bytes``) and equals *S* (``isolation``: the training step
    that ran while the save was in flight did not leak into it).
"""

from __future__ import annotations

from harness.calibration import tolerances
from harness.checks.base import Check
from harness.checks.parity import losses
from harness.distributed import checkpoint
from harness.distributed.gather import on_rank0
from harness.distributed.run import mesh_independent

BITWISE = tolerances.BITWISE


def _is_lazy(key: str, lazy: tuple[str, ...]) -> bool:
    buffer = key.partition("#")[2]
    return bool(buffer) and any(frag in buffer for frag in lazy)


def _eager(state: dict, lazy) -> dict:
    return {k: v for k, v in state.items() if not _is_lazy(k, lazy)}


def dcp_roundtrip(art, rec) -> None:
    case, saved, cont, fresh = art.case, art["checkpoint"], art["continued"], art["loaded"]
    lazy = tuple(getattr(art.ctx.backend, "lazy_buffers", ()))
    got = fresh.full_state()
    rec.compare("dcp_roundtrip", "state", _eager(got, lazy), _eager(saved.state, lazy), BITWISE)
    if lazy:
        both = {k for k in set(got) & set(saved.state) if _is_lazy(k, lazy)}
        rec.compare("dcp_roundtrip", "cached_buffers", {k: got[k] for k in both},
                    {k: saved.state[k] for k in both}, BITWISE)
    loss, _ = fresh.step(case.train.steps)
    rec.compare("dcp_roundtrip", "next_loss", losses([loss]), losses([cont.loss]), BITWISE)
    rec.compare("dcp_roundtrip", "next_params", fresh.full_params(), cont.params, BITWISE)
    if lazy and cont.state is not None:
        after = fresh.full_state()
        rec.compare("dcp_roundtrip", "rebuilt_buffers",
                    {k: v for k, v in after.items() if _is_lazy(k, lazy)},
                    {k: v for k, v in cont.state.items() if _is_lazy(k, lazy)}, BITWISE)


def async_equivalence(art, rec) -> None:
    saved = art["checkpoint"]

    def compare_files():
        canonical = art.ctx.backend.canonical_state
        content = canonical(checkpoint.read_full(saved.main))
        rec.compare("async_equivalence", "bytes", content, canonical(checkpoint.read_full(saved.twin)),
                    BITWISE)
        rec.compare("async_equivalence", "isolation", content, mesh_independent(saved.state),
                    BITWISE)
    on_rank0(art.ctx, compare_files)


DCP_ROUNDTRIP = Check("dcp_roundtrip", ("loaded", "checkpoint", "continued"), dcp_roundtrip)
ASYNC_EQUIVALENCE = Check("async_equivalence", ("checkpoint",), async_equivalence)
