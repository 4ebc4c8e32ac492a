"""backends/te_fresh_amax.py without TE: which recipe states a built model's reset finds (a TE
module's ``fp8_meta``, a te.ops operation's ``_fp8_metas`` per mode) and what it leaves."""

from types import SimpleNamespace

import torch
from torch import nn

from harness.backends import te_fresh_amax


def _state(amax: float):
    return SimpleNamespace(amax_history=torch.full((4, 3), amax), scale=torch.full((3,), 0.5))


class TEModule(nn.Module):  # a TE module: fp8_meta holds its recipe states beside other entries
    def __init__(self, amax):
        super().__init__()
        self.fp8_meta = {"fp8_checkpoint": False, "fp8_group": None,
                         "scaling_fwd": _state(amax), "scaling_bwd": _state(amax)}


class Op(nn.Module):  # a te.ops operation: recipe states per mode, a mode may have none
    def __init__(self, amax):
        super().__init__()
        self._fp8_metas = {"forward": {"scaling_fwd": _state(amax), "recipe": "r"},
                           "backward": None}


def test_every_recipe_state_is_fresh_and_keeps_its_tensors():
    model = nn.Sequential(TEModule(0.105), nn.Linear(2, 2), nn.Sequential(Op(0.3)))
    history = model[0].fp8_meta["scaling_fwd"].amax_history  # TE's global buffers view these
    plain = model[1].weight.detach().clone()
    assert te_fresh_amax.reset(model) == 3
    states = [model[0].fp8_meta["scaling_fwd"], model[0].fp8_meta["scaling_bwd"],
              model[2][0]._fp8_metas["forward"]["scaling_fwd"]]
    for s in states:
        assert torch.count_nonzero(s.amax_history) == 0 and torch.all(s.scale == 1.0)
    assert model[0].fp8_meta["scaling_fwd"].amax_history is history
    assert torch.equal(model[1].weight, plain)  # a module without recipe states: untouched


def test_a_model_without_recipe_states_is_left_alone():
    model = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))
    before = [p.detach().clone() for p in model.parameters()]
    assert te_fresh_amax.reset(model) == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
