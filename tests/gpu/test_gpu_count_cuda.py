"""On a GPU host NVML (what pytest counts GPUs with before its first launch, harness/plugin/gpu_count.py)
sees the GPUs torch sees (skips without CUDA, or where CUDA_VISIBLE_DEVICES hides some)."""

import os

import pytest
import torch

from harness.plugin import gpu_count as gpu
from harness.plugin.environment import RunEnvironment


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif("CUDA_VISIBLE_DEVICES" in os.environ,
                    reason="CUDA_VISIBLE_DEVICES set: torch counts a subset, NVML all")
def test_nvml_counts_the_gpus_torch_counts():
    assert gpu.nvml_device_count() == torch.cuda.device_count()
    assert RunEnvironment("te", "cuda", None, "never").max_world() == torch.cuda.device_count()
