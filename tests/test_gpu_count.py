"""The GPUs a cuda run counts before its first launch (harness/plugin/gpu_count.py): from
CUDA_VISIBLE_DEVICES where set, else from NVML without importing torch, else torch's count; and
cases skip with a reason where torch cannot use CUDA at all."""

import json
import subprocess
import sys
from pathlib import Path

from harness.plugin import gpu_count as gpu
from harness.plugin.environment import RunEnvironment
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def test_counting_through_nvml_imports_no_torch():
    code = ("import json, sys; import harness.plugin.gpu_count as g; g.nvml_device_count = lambda: 3\n"
            "from harness.plugin.environment import RunEnvironment\n"
            "e = RunEnvironment('torch', 'cuda', None, 'never')\n"
            "print(json.dumps([e.visible_gpus(), e.max_world(), 'torch' in sys.modules]))")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [["0", "1", "2"], 3, False]


def test_cuda_visible_devices_wins_over_the_driver_count(monkeypatch):
    monkeypatch.setattr(gpu, "nvml_device_count", lambda: 8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")
    assert RunEnvironment("torch", "cuda", None).visible_gpus() == ["3", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    e = RunEnvironment("torch", "cuda", None)
    assert (e.visible_gpus(), e.max_world()) == ([], 0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert RunEnvironment("torch", "cuda", None, "never").max_world() == 8
    assert RunEnvironment("torch", "cuda", None).max_world() > 8  # ranks share the 8 GPUs
    assert RunEnvironment("torch", "cpu", None).visible_gpus() == []


def test_without_nvml_torch_counts(monkeypatch):
    import torch
    monkeypatch.setattr(gpu, "nvml_device_count", lambda: None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    expected = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert RunEnvironment("torch", "cuda", None, "never").max_world() == expected


def test_cases_skip_where_torch_cannot_use_cuda():
    (case, *_) = expand(load_scenario(ROOT / "scenarios" / "smoke.yaml"), "torch")
    e = RunEnvironment("torch", "cuda", None)
    e._cuda_usable = False  # a CPU-only torch on a host whose driver sees GPUs
    assert "torch.cuda.is_available() is False" in e.skip_reason(case, max_world=8)
    e._cuda_usable = True
    assert e.skip_reason(case, max_world=8) is None
    assert "needs" in e.skip_reason(case, max_world=1)


class _FakeNvml:
    """libnvidia-ml's three calls: init's status, the count it reports, shutdown counted."""

    def __init__(self, init_status=0, count=2):
        self.init_status, self.count, self.shutdowns = init_status, count, 0

    def nvmlInit_v2(self):
        return self.init_status

    def nvmlDeviceGetCount_v2(self, ref):
        ref._obj.value = self.count
        return 0

    def nvmlShutdown(self):
        self.shutdowns += 1
        return 0


def test_nvml_count_and_where_it_cannot_say(monkeypatch):
    lib = _FakeNvml(count=4)
    monkeypatch.setattr(gpu.ctypes, "CDLL", lambda name: lib)
    assert (gpu.nvml_device_count(), lib.shutdowns) == (4, 1)
    monkeypatch.setattr(gpu.ctypes, "CDLL", lambda name: _FakeNvml(init_status=9))
    assert gpu.nvml_device_count() is None  # NVML_ERROR_DRIVER_NOT_LOADED and the like

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")
    monkeypatch.setattr(gpu.ctypes, "CDLL", missing)
    assert gpu.nvml_device_count() is None


def test_the_plugins_import_loads_neither_torch_nor_pandas():
    """pytest imports the plugin before anything runs, the first launch waits on it: torch
    loads in the rank server and where the backend is asked, pandas where results are read or
    written (harness/calibration/derive.py imports it where used)."""
    code = "import json, sys, harness.plugin; print(json.dumps([m in sys.modules for m in " \
           "('torch', 'pandas')]))"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [False, False]
