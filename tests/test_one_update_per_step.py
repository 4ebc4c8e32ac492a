"""The one-rank twin's DelayedScaling histories advance once per step (reference backend):
while ``OneUpdatePerStep`` is active every GEMM's history update is held back, and the flush
records, per call of the step, the max over the slices -- what the sharded run's all-reduce
makes of the ranks' amaxes."""

import torch

from harness.reference.formats import fp8
from harness.reference.quantizers import OneUpdatePerStep, QuantState


def _history(amaxes_per_slice, held: bool):
    state = QuantState()
    if held:
        with OneUpdatePerStep() as h:
            for amaxes in amaxes_per_slice:
                h.next_slice()
                for a in amaxes:
                    state.record("input", torch.tensor(a), fp8.E4M3)
    else:
        for amaxes in amaxes_per_slice:
            for a in amaxes:
                state.record("input", torch.tensor(a), fp8.E4M3)
    return state.input_amax_history[:4].tolist(), float(state.scale("input"))


def test_held_updates_are_the_max_over_slices_once_per_call():
    # two calls of one GEMM per step; slice 0 sees amaxes (1, 5), slice 1 (3, 2)
    held, scale = _history([(1.0, 5.0), (3.0, 2.0)], held=True)
    assert held == [5.0, 3.0, 0.0, 0.0]  # newest first: call 2 -> max(5, 2), call 1 -> max(1, 3)
    assert scale == float(fp8.scale_from_amax(torch.tensor(5.0), fp8.E4M3))
    # the sharded run: each rank records max over ranks per call -> the same history
    sharded, sharded_scale = _history([(3.0, 5.0)], held=False)
    assert (held, scale) == (sharded, sharded_scale)
    # without holding back, every slice rolls the history: what the twin did before
    assert _history([(1.0, 5.0), (3.0, 2.0)], held=False)[0] == [2.0, 3.0, 5.0, 1.0]


def test_nothing_is_held_outside_the_context_and_the_scale_waits_for_the_flush():
    state = QuantState()
    with OneUpdatePerStep():
        state.record("grad", torch.tensor(7.0), fp8.E5M2)
        assert float(state.scale("grad")) == 1.0  # the slices of one step share a scale
        assert OneUpdatePerStep.active is not None
    assert OneUpdatePerStep.active is None
    assert state.grad_amax_history[0] == 7.0
