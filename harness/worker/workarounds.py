"""Named workarounds an xfail registry entry may apply (its ``workaround`` field).

When a producer fails in a case whose registry entry names a workaround for it, the worker
records the failure, makes the artifact the workaround's way, and runs every remaining check on
what the workaround produced -- bitwise, like every other case. Whatever those checks find is a
finding of its own (a registry entry with measured numbers), never hidden by the first one.

A workaround is a small function with the signature of the call it replaces; today every one
replaces a checkpoint load (``fn(run, path)``), used by the producers ``load`` and
``reshard_load``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Workaround:
    name: str
    units: tuple[str, ...]  # the producers it can stand in for
    fn: Callable
    what: str  # one line: what it does differently


def load_without_extra_state(run, path) -> None:
    """Load the way TransformerEngine's own tests do (TE issue #1860): drop every module's
    ``_extra_state`` (DelayedScaling's amax history and scales) from the model state dict, load
    the rest with DCP, and apply it with ``strict=False``. The loaded model keeps its own (fresh)
    ``_extra_state``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    from harness.distributed.checkpoint import app_state, verify
    verify(path)
    state = app_state(run)
    state["model"] = {k: v for k, v in state["model"].items() if not k.endswith("_extra_state")}
    dcp.load(state, checkpoint_id=str(path))
    # model.load_state_dict directly: torch's set_model_state_dict fills keys it is not given
    # with a placeholder object that TE's set_extra_state rejects
    run.model.load_state_dict(state["model"], strict=False)
    set_optimizer_state_dict(run.model, run.optim, state["optim"])


WORKAROUNDS = {w.name: w for w in [
    Workaround("load_without_extra_state", ("load", "reshard_load"), load_without_extra_state,
               "load without the modules' _extra_state (strict=False), as TE's tests do"),
]}
