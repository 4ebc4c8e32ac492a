"""te_global_state.isolated without TE: a fresh state inside, the case's bindings back after,
for both layouts of TE's FP8GlobalStateManager (one ``quantization_state`` object, TE 2.20; the
class's own attributes, older TE) -- also when the run inside raises."""

import pytest

from harness.backends import te_global_state


class _State:
    def __init__(self):
        self.global_amax_buffer = {}


class NewTE:  # TE 2.20: the state is one object
    quantization_state = _State()

    @classmethod
    def reset(cls):
        cls.quantization_state = _State()


class OldTE:  # older TE: the state is the class's attributes
    FP8_ENABLED = False
    global_amax_buffer = {}

    @classmethod
    def reset(cls):
        cls.FP8_ENABLED = False
        cls.global_amax_buffer = {}


def test_new_layout_swapped_and_put_back():
    case = NewTE.quantization_state
    case.global_amax_buffer["bwd"] = [1.0]
    with te_global_state.isolated(NewTE):
        assert NewTE.quantization_state is not case
        assert NewTE.quantization_state.global_amax_buffer == {}
    assert NewTE.quantization_state is case and case.global_amax_buffer == {"bwd": [1.0]}


def test_old_layout_swapped_and_put_back_even_when_the_run_raises():
    OldTE.FP8_ENABLED, OldTE.global_amax_buffer = True, {"bwd": [2.0]}
    case = OldTE.global_amax_buffer
    with pytest.raises(ValueError):
        with te_global_state.isolated(OldTE):
            assert OldTE.global_amax_buffer == {} and OldTE.FP8_ENABLED is False
            raise ValueError("the reference failed")
    assert OldTE.global_amax_buffer is case and OldTE.FP8_ENABLED is True
    assert callable(OldTE.reset)  # methods are never rebound
