"""A bundled port of TE PR #2713's ``set_device_mesh(tp_mesh, weight_mesh)`` for the te backend.

PR #2713 (open, unmerged; no TE release up to 2.20.2 has it) makes TE's TP-sharded parameters
DTensors, so FSDP2 shards them again with ``_StridedShard`` and DCP knows where each TP shard
belongs. Where the installed TE has ``set_device_mesh`` (``hasattr(te.Linear,
"set_device_mesh")``) the te backend calls TE's own; otherwise it applies this port
(:func:`tp_support` says which). One small file per piece, written against TE 2.20.2:

    placements.py     (a) which parameter of which TE module gets which placement (pure rules)
    dtensor_params.py (b) a module's TP-local parameters -> DTensors on ``tp_mesh``; forward
                          hands TE's kernels the DTensors' local tensor objects
    allgather_out.py  (c) ``fsdp_post_all_gather(out=...)``: FSDP2's DTensor ``out`` unwrapped
    block_storage.py  (d) ``untyped_storage()`` of Float8Blockwise / MXFP8 / NVFP4 tensors
    amax_group.py     (e) ``weight_mesh``'s group for current-scaling weight amaxes
    port.py           ``set_device_mesh`` (TE's or the port's) and a case's class patches

Each piece is a switch (:func:`on`); turning one off (:func:`switch_off`) is a te mutant,
``mutation: no_tp_<piece>`` (te_mutations.py, scenario ``te_mutations``). The placement rules
(a) have no switch of their own: they are what (b) applies; (b) off leaves the TP shards plain
parameters -- TE before the PR.
"""

from __future__ import annotations

from typing import Callable

NATIVE = "native"
BUNDLED = "bundled port of #2713"
PIECES = {
    "dtensor_params": "TP-local parameters become DTensors on the TP mesh (column Shard(0), row "
                      "Shard(1), norms and row biases Replicate); forward computes with their "
                      "local tensors",
    "local_identity": "forward hands TE the DTensor's very local tensor object (an identity "
                      "autograd function), not a to_local() alias, so FSDP2's in-place "
                      "re-gather in backward is what TE's saved weight sees",
    "allgather_out": "fsdp_post_all_gather gets the local tensor of FSDP2's out= DTensor (an "
                     "FSDP2 x TP unsharded parameter), not the DTensor",
    "block_storage": "Float8Blockwise / MXFP8 / NVFP4 untyped_storage(): the rowwise or "
                     "columnwise data's storage, else a 1-byte storage (never a null pointer)",
    "amax_group": "current-scaling / NVFP4 weight amaxes reduced over weight_mesh (FSDP shard x "
                  "TP), not TE's mesh['shard'] alone",
}

_off: set[str] = set()


class PortError(RuntimeError):
    """The installed TE lacks something a piece of the port needs (names the piece)."""

    def __init__(self, piece: str, what: str):
        super().__init__(f"TE #2713 port, piece {piece!r}: {what}")
        self.piece = piece


def on(name: str) -> bool:
    if name not in PIECES:
        raise KeyError(f"{name!r} is no piece of the #2713 port; pieces: {', '.join(PIECES)}")
    return name not in _off


def switch_off(name: str) -> Callable[[], None]:
    """Turn piece ``name`` off until the returned function is called (a te mutant)."""
    on(name)
    was_off = name in _off
    _off.add(name)

    def undo() -> None:
        if not was_off:
            _off.discard(name)
    return undo


def tp_support(te) -> str:
    """``native`` where the installed TE has ``set_device_mesh``, else the bundled port."""
    return NATIVE if hasattr(te.Linear, "set_device_mesh") else BUNDLED


def set_attr(obj, name: str, value, undo: list) -> None:
    """Set class attribute ``obj.name``, remembering in ``undo`` how to restore it."""
    if name in obj.__dict__:
        old = obj.__dict__[name]
        undo.append(lambda: setattr(obj, name, old))
    else:
        undo.append(lambda: delattr(obj, name))
    setattr(obj, name, value)
