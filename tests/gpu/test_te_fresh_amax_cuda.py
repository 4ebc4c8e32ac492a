"""A TE DelayedScaling model starts from the amax of the weights it starts from: the twin of a
delayed case is the same whatever state the CUDA generator was in (backends/te_fresh_amax.py;
skips without a GPU or TE).

Before, the amax of the random weights TE's ``reset_parameters`` drew stayed in the weight's
amax history after the reference's weights were copied in; the first scale update used it, and
the twin's loss[1] moved from build to build (1.12489-1.1305 for dp2 LayerNormLinear)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
CASE = "fsdp2_tp_dcp[delayed-dp4-Linear-sync-none]"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_delayed_twin_is_the_same_after_any_generator_state(require_te):
    require_te()
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("twin_builds.py")),
                           str(ROOT / "scenarios" / "fsdp2_tp_dcp.yaml"), CASE, "3"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    builds = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(builds) == 3, proc.stdout[-3000:]
    for b in builds:  # te.Linear's forward quantizers: input, weight, output
        assert b["amax_row0"] == [0.0, b["weight_amax"], 0.0], b
    assert all(b["losses"] == builds[0]["losses"] for b in builds), builds
