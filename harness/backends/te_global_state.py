"""TE's process-global FP8 state (``FP8GlobalStateManager``): reset per case, and a state of
its own for a run one rank makes alone inside a case."""

from __future__ import annotations

import contextlib
import types


def manager():
    try:
        from transformer_engine.pytorch.quantization import FP8GlobalStateManager
    except ImportError:  # older TE: the manager lives in fp8.py
        from transformer_engine.pytorch.fp8 import FP8GlobalStateManager
    return FP8GlobalStateManager


def roots() -> list:
    """What of TE's process-global state a step changes (distributed/restore_point.py)."""
    return [manager()]


@contextlib.contextmanager
def isolated(state_manager=None):
    """TE's global FP8 state swapped for a fresh one while rank 0 runs alone (the FP32
    reference, the one-rank twin: ``TEBackend.isolated``), the case's put back after. Else the
    rank's run meets the case's DelayedScaling amax buffers: a te.ops module (te.LayerNorm /
    RMSNorm) under ``te.autocast(enabled=False)`` outside any FP8 region is TE's "first FP8
    module", and its backward reduces every buffered amax over the buffers' group -- the world
    -- on rank 0 alone: over NCCL that collective waits for the other ranks for good, over gloo
    it fails ("Connection closed by peer"), and where it goes through it moves the case's amax
    histories. ``state_manager`` (default TE's): its state is one
    ``quantization_state`` object (TE 2.20) or -- older TE -- the class's own attributes; either
    way ``reset`` rebinds them, so the bindings saved here are the case's state."""
    m = state_manager if state_manager is not None else manager()
    saved = {k: v for k, v in vars(m).items()
             if not k.startswith("__") and not isinstance(v, (classmethod, staticmethod,
                                                                property, types.FunctionType))}
    m.reset()
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(m, k, v)


class OneUpdatePerStep(contextlib.AbstractContextManager):
    """Around one step of the one-rank twin's micro-batches under DelayedScaling
    (distributed/single.py): the amax reductions and scale updates TE makes as each slice's
    autocast region ends (forward) and as its first module's backward ends (backward) wait for
    the step's last slice and then run once each -- from the amaxes every slice's casts maxed
    into the histories' first row, as the sharded run's all-reduce over its ranks makes them.
    Run per slice they advanced the histories once per slice."""

    NAME = "reduce_and_update_fp8_tensors"

    def __init__(self, state_manager=None):
        self.m = state_manager
        self.asked: list[bool] = []  # the directions (forward?) TE asked for, in order

    def __enter__(self):
        self.m = self.m if self.m is not None else manager()
        self.saved = vars(self.m).get(self.NAME)  # the classmethod object itself

        def deferred(cls, forward: bool = True) -> None:
            if forward not in self.asked:
                self.asked.append(forward)
        setattr(self.m, self.NAME, classmethod(deferred))
        return self

    def next_slice(self) -> None:
        pass

    def __exit__(self, *exc) -> None:
        if self.saved is None:
            delattr(self.m, self.NAME)
        else:
            setattr(self.m, self.NAME, self.saved)
        if exc[0] is None:
            for forward in self.asked:
                getattr(self.m, self.NAME)(forward=forward)
        return None
