"""A run rank 0 makes alone inside a case (the FP32 reference, the one-rank twin) gets TE's
global FP8 state of its own (``TEBackend.isolated``; skips without a GPU or TE).

Before, LlamaStack's FP32 reference, computed after the case's DelayedScaling steps, met the
case's amax buffers: its final te.LayerNorm (a te.ops module) under ``te.autocast(enabled=False)``
counted as TE's first FP8 module, and its backward reduced the buffered amaxes over the world on
rank 0 alone -- over NCCL the case hung, over gloo its reference failed ("Connection closed by
peer"). It passed only where another case had cached that reference first.
"""

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration
CALIBRATION = Path(__file__).resolve().parents[2] / "scenarios" / "calibration.yaml"


def test_isolated_gives_a_fresh_state_and_puts_the_cases_back(require_te):
    require_te()
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import DelayedScaling

    from harness.backends import get, te_global_state
    manager = te_global_state.manager()
    manager.reset()
    layer = te.Linear(32, 32, params_dtype=torch.bfloat16, device="cuda")
    x = torch.randn(16, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with te.autocast(enabled=True, recipe=DelayedScaling()):
        y = layer(x)
    y.sum().backward()
    case_state = manager.quantization_state
    assert case_state.global_amax_buffer, "DelayedScaling buffered no amax: nothing to isolate"
    with get("te").isolated():
        assert manager.quantization_state is not case_state
        assert not manager.quantization_state.global_amax_buffer
    assert manager.quantization_state is case_state
    manager.reset()


def test_delayed_llama_stack_computes_its_own_reference(require_te, run_matrix):
    require_te(CALIBRATION)
    case = "delayed-dp2-LlamaStack-sync-none-1"
    # a fresh report directory: the reference is not cached, the case computes it itself;
    # --gpu-share always: gloo on any host (over NCCL the old code hung until the case timeout)
    proc, summary, history = run_matrix("isolated", [case], "--gpu-share", "always",
                                           "--case-timeout", "120", timeout_s=300,
                                           scenario="calibration")
    assert summary is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list(summary.case_id) == [f"calibration[{case}]"]
    ref = history[(history.check == "reference") & (history.metric == "coverage")]
    assert list(ref.row_outcome) == ["passed"], history[history.check == "reference"]
    seconds = history[(history.check == "reference") & (history.metric == "seconds")].value
    assert seconds.max() > 0.5, "the reference came from a cache: this run tests nothing"
    assert list(summary.case_outcome) == ["passed"], proc.stdout[-3000:]
