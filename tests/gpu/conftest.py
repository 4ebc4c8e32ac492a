"""What the GPU tests share: skipping where TE cannot run here, and a scenario's cases run as a
user would (pytest with the plugin, in a subprocess; TE unless another backend is named)."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
MATRIX = ROOT / "scenarios" / "fsdp2_tp_dcp.yaml"


@pytest.fixture(scope="session")
def require_te():
    """``require_te(scenario, gpus)``: skip unless ``gpus`` CUDA GPUs are here and TE can run
    the scenario's first case on them (the backend's own skip reason)."""
    def require(scenario: Path = MATRIX, gpus: int = 1) -> None:
        import torch

        from harness.backends import get
        from harness.spec.matrix import expand
        from harness.spec.scenario import load_scenario
        n = torch.cuda.device_count()
        if n < gpus:
            pytest.skip(f"needs {gpus} CUDA GPU(s); {n} here")
        why = get("te").skip_reason(expand(load_scenario(scenario), "te")[0], "cuda")
        if why:
            pytest.skip(why)
    return require


def _run_plugin(args: list[str], out: Path, timeout_s: float):
    """``pytest -p harness.plugin -q ARGS --report-dir OUT`` as a user runs it, in a subprocess
    that imports this checkout; (the finished process, its summary.csv, its history) -- the
    frames None where the run wrote none."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "harness.plugin", "-q", *args,
                           "--report-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=env)
    summary, history = (next(out.glob(g), None) for g in ("runs/*/summary.csv",
                                                          "history/*.parquet"))
    return proc, summary and pd.read_csv(summary), history and pd.read_parquet(history)


@pytest.fixture(scope="session")
def run_matrix(tmp_path_factory):
    """``run_matrix(name, cases, *options, timeout_s, scenario, backend)``: ``pytest --scenario
    SCENARIO --backend BACKEND`` (default fsdp2_tp_dcp, te) on ``cases`` (ids inside the
    brackets, exact: a -k substring took seed 10 with seed 1) with ``options``; (the finished
    process, its summary.csv, its history) -- the frames None where the run wrote none."""
    def run(name: str, cases: list[str], *options: str, timeout_s: float,
            scenario: str = "fsdp2_tp_dcp", backend: str = "te"):
        return _run_plugin(["-p", "no:cacheprovider", "--scenario", scenario, "--backend",
                            backend, *options,
                            *(f"scenarios/{scenario}.yaml::{scenario}[{c}]" for c in cases)],
                           tmp_path_factory.mktemp(name), timeout_s)
    return run


@pytest.fixture
def run_scenario_file(tmp_path):
    """``run_scenario_file(path, timeout_s)``: ``pytest --scenario PATH --backend te`` on every
    case of a scenario file (tests/scenarios/), with a pytest cache of its own (populations
    measured on demand stay in the test); (its output, its history -- None where it wrote
    none)."""
    def run(scenario: Path, timeout_s: float):
        proc, _, history = _run_plugin(["--scenario", str(scenario), "--backend", "te", "-o",
                                        f"cache_dir={tmp_path / 'cache'}"], tmp_path, timeout_s)
        return proc.stdout + proc.stderr, history
    return run
