"""The accelerations behind one seam (harness/speed/layers.py): each layer switchable, each
switch asked by the code it names, and the plain path -- every layer off -- giving every case
the outcome and the rows the accelerated run gives."""

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from subprocs import ROOT, harness_env

from harness.plugin import execution, options
from harness.speed import layers

HARNESS = ROOT / "harness"


def test_parse_names_all_none_and_single_layers():
    assert layers.parse("all") == layers.ALL and layers.parse("none") == layers.PLAIN
    assert layers.parse("all,-reference_cache").on == set(layers.NAMES) - {"reference_cache"}
    assert layers.parse("none,inductor_cache").on == {"inductor_cache"}
    assert layers.parse("gc_pause, task_seconds").on == {"gc_pause", "task_seconds"}
    for bad in ("", "fast", "all,-nope"):
        with pytest.raises(ValueError):
            layers.parse(bad)
    with pytest.raises(KeyError, match="no acceleration layer"):
        "rank_servr" in layers.ALL  # noqa: B015 - a typo in the code is an error, not "off"


def test_the_choice_travels_in_the_launch_environment(monkeypatch):
    for acc in (layers.ALL, layers.PLAIN, layers.parse("all,-compare_fast_path")):
        assert layers.from_env(acc.env()) == acc
    assert layers.from_env({}) == layers.ALL  # a worker started by hand: the default
    monkeypatch.setenv(layers.VAR, "none,reference_cache")
    assert layers.active("reference_cache") and not layers.active("compare_fast_path")
    assert layers.parse("all,-gc_pause").describe() == "all but gc_pause"
    assert (layers.ALL.describe(), layers.PLAIN.describe()) == ("all", "none")


def test_every_layer_is_listed_once_and_asked_by_the_code():
    """A layer nobody asks would be a switch that switches nothing."""
    assert len(set(layers.NAMES)) == len(layers.NAMES)
    code = {p: p.read_text() for p in HARNESS.rglob("*.py") if p.name != "layers.py"}
    for layer in layers.LAYERS:
        assert layer.does and layer.code, layer.name
        asked = [p for p, text in code.items() if f'"{layer.name}"' in text]
        assert asked, f"no module of harness/ asks for layer {layer.name!r}"


def _hs(tmp_path, device="cuda", gpus=("0", "1"), **given):
    opts = {"work_dir": str(tmp_path), "launches_per_gpu": None, "nnodes": 1,
            "rdzv_endpoint": None, "node_launcher": None, "gpu_share": "auto",
            "rank_start": "auto", "accelerations": "all", **given}
    return SimpleNamespace(device=device, config=SimpleNamespace(getoption=opts.get, cache={}),
                           env=SimpleNamespace(visible_gpus=lambda: list(gpus)))


def test_the_run_folds_in_the_older_switches(tmp_path):
    gpu = execution.accelerations(_hs(tmp_path))
    assert gpu == layers.ALL
    assert execution.rank_start(_hs(tmp_path)) == "fork"
    fresh = execution.accelerations(_hs(tmp_path, rank_start="fresh"))
    assert fresh == layers.ALL.without("rank_server", "stager_fork", "stager_no_gpu")
    assert "lane_per_module" not in execution.accelerations(_hs(tmp_path, launches_per_gpu=2))
    cpu = execution.accelerations(_hs(tmp_path, device="cpu"))
    assert not {"stager_prestart", "stager_no_gpu", "lane_per_module", "cpu_priority"} & cpu.on
    assert {"rank_server", "stager_fork"} <= cpu.on  # CPU ranks fork too (--rank-start auto)
    assert "context_order" not in cpu.on  # (measured on 2 GPUs; slower on one)
    assert execution.accelerations(_hs(tmp_path, gpus=("0",))) == layers.ALL.without(
        "context_order")
    plain = _hs(tmp_path, accelerations="none")
    assert execution.accelerations(plain) == layers.PLAIN
    assert execution.rank_start(plain) == "fresh"


@pytest.mark.parametrize("given, message", [
    ({"accelerations": "fast"}, "--accelerations fast: no layer 'fast'"),
    ({"accelerations": "none", "rank_start": "fork"}, "--rank-start fork: forks from the rank")])
def test_bad_choices_are_usage_errors(given, message):
    opts = {"rank_start": "auto", **given}
    with pytest.raises(pytest.UsageError, match=message):
        options.check_accelerations(SimpleNamespace(getoption=lambda k, d=None: opts.get(k, d)))


SCENARIO = """\
name: accel
description: three world-2 cases -- two share their FP32 reference, one saves async_process
axes:
  recipe: [fp32, bf16]
  mesh: [dp2]
  module: [Linear, LayerNormMLP]
  dcp: [sync, async_thread, async_process]
  reshard: [none]
cases:
  - {recipe: fp32, mesh: dp2, module: Linear, dcp: sync, reshard: none}
  - {recipe: bf16, mesh: dp2, module: Linear, dcp: async_process, reshard: none}
  - {recipe: bf16, mesh: dp2, module: LayerNormMLP, dcp: async_thread, reshard: none}
timeout_s: 240
"""
KEY = ["case_id", "phase", "check", "quantity", "metric"]


def _rows(tmp_path: Path, scen: Path, name: str, *args: str) -> pd.DataFrame:
    store = tmp_path / name
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "harness.plugin", "--scenario",
                        "accel", "--scenario-dir", str(scen), "--report-dir", str(store),
                        "-o", f"cache_dir={tmp_path / 'cache'}", *args],
                       cwd=ROOT, env=harness_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (history,) = (store / "history").glob("*.parquet")
    return pd.read_parquet(history).set_index(KEY).sort_index()


@pytest.mark.integration
def test_the_plain_path_gives_every_case_the_same_outcome_and_rows(tmp_path):
    """Every layer on (ranks and stagers forked from the rank server on this CPU host too)
    against none: the same cases, outcomes, row outcomes and tolerances; the measured values
    equal but for the last bits of float64 sums (the compare fast path sums in another
    order); only the time rows differ."""
    scen = tmp_path / "scen"
    scen.mkdir()
    (scen / "accel.yaml").write_text(SCENARIO)
    fast = _rows(tmp_path, scen, "all", "--accelerations", "all", "--rank-start", "fork")
    plain = _rows(tmp_path, scen, "none", "--accelerations", "none")
    assert fast.index.equals(plain.index)
    for col in ("case_outcome", "row_outcome", "tolerance", "xfail_entry", "detail"):
        pd.testing.assert_series_equal(fast[col], plain[col], check_exact=True)
    measured = (fast.index.get_level_values("quantity") != "time") & \
        (fast.index.get_level_values("metric") != "duration_s")
    pd.testing.assert_series_equal(fast["value"][measured], plain["value"][measured],
                                   rtol=1e-12, atol=0)
    assert set(fast["case_outcome"]) <= {"passed", "xfailed"}
