"""The torch backend's TP cases whose column-parallel output is gathered (Linear,
LayerNormLinear, LlamaStack's head) on ranks sharing a GPU over gloo (GPU; skips without one).

Before ``parallel.apply_tp`` gathered those outputs with c10d there, every such case's ranks died
of SIGSEGV in training (DTensor's functional all-gather on CUDA tensors over gloo): 28 of the
fsdp2_tp_dcp matrix's torch cases on a GPU crashed. Here a few of them run as a user would and
must pass, over gloo with ranks sharing a GPU.
"""

import pandas as pd
import pytest

pytestmark = pytest.mark.integration
CASES = {"fsdp2_tp_dcp": ["fp32-dp2xtp2-Linear-sync-none",
                          "bf16-dp2xtp2-LayerNormLinear-async_thread-to_dp2"],
         "llama_stack": ["bf16-dp2xtp2-LlamaStack-async_thread-to_dp2"]}


@pytest.mark.parametrize("scenario", sorted(CASES))
def test_torch_colwise_gathered_tp_cases_pass_on_shared_gpus(scenario, run_matrix):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    proc, summary, history = run_matrix(f"torch-{scenario}", CASES[scenario], "--device",
                                           "cuda", "--gpu-share", "always", timeout_s=500,
                                           scenario=scenario, backend="torch")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert sorted(summary.case_outcome) == ["passed"] * len(CASES[scenario]), summary.to_string()
    ran = history[history.case_id.isin({f"{scenario}[{c}]" for c in CASES[scenario]})]
    assert set(ran.pg_backend.dropna()) == {"gloo"} and set(ran.device) == {"cuda"}
    assert pd.to_numeric(ran.ranks_per_gpu).min() >= 2  # ranks sharing a GPU: the path that crashed
