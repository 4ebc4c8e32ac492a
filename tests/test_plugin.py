"""The pytest plugin end to end, in pytest subprocesses (fresh interpreter, real launches)."""

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from forked import FORK
from subprocs import run_pytest

SCENARIO = """\
name: tiny
description: plugin self-test
axes:
  recipe: [fp32]
  mesh: [dp2]
  module: [LayerNormMLP]
  dcp: [sync, async_thread]
  reshard: [none, to_dp4]
  fault: [none, perturb_reference, skip_load, perturb_loaded]
cases:
  - {fault: perturb_reference, reshard: none, dcp: sync}
  - {fault: none, reshard: none, dcp: sync}
  - {fault: skip_load, reshard: none, dcp: sync}
  - {fault: none, reshard: to_dp4, dcp: sync}
  - {fault: perturb_loaded, reshard: to_dp4}
timeout_s: 60
"""

REGISTRY = """\
entries:
  - match: {scenario: tiny, fault: perturb_reference}
    fails: {check: fp32_parity}
    reason: reference perturbed on purpose
    link: https://example.org/a
  - match: {scenario: tiny, fault: none, reshard: none}
    fails: {check: fp32_parity}
    reason: claims a failure that does not happen
    link: https://example.org/b
  - match: {scenario: tiny, fault: skip_load}
    fails: {check: fp32_parity}
    reason: expects the wrong check
    link: https://example.org/c
  - match: {scenario: tiny, fault: perturb_loaded}
    fails: {check: dcp_roundtrip}
    reason: explains the same-mesh round trip only
    link: https://example.org/d
  - match: {scenario: tiny, fault: perturb_loaded, dcp: async_thread}
    fails: {check: reshard}
    reason: explains the reshard failure of the async case
    link: https://example.org/e
"""


@pytest.fixture
def tiny(tmp_path):
    d = tmp_path / "scen"
    d.mkdir()
    (d / "tiny.yaml").write_text(SCENARIO)
    return d


def test_unknown_scenario_is_a_usage_error(tmp_path, tiny):
    name = "nope"
    rc, out = run_pytest(tmp_path, "--scenario", name, "--scenario-dir", str(tiny))
    assert rc == 4
    assert f"--scenario {name}: no scenarios/{name}.yaml" in out and "available: tiny" in out


def test_invalid_scenario_names_file_and_field(tmp_path, tiny):
    (tiny / "tiny.yaml").write_text(SCENARIO.replace("mesh: [dp2]", "mesh: [dp3x]"))
    rc, out = run_pytest(tmp_path, "--scenario", "tiny", "--scenario-dir", str(tiny))
    assert rc == 4
    assert "tiny.yaml: axes.mesh[0]: bad mesh 'dp3x'" in out


def test_collect_only_and_k_selection(tmp_path, tiny):
    rc, out = run_pytest(tmp_path, "--scenario", "tiny", "--scenario-dir", str(tiny),
                         "--collect-only", "-q")
    assert rc == 0, out
    assert "tiny.yaml::tiny[fp32-dp2-LayerNormMLP-sync-to_dp4-none]" in out
    assert "6 tests collected" in out
    rc, out = run_pytest(tmp_path, "--scenario", "tiny", "--scenario-dir", str(tiny),
                         "--collect-only", "-q", "-k", "to_dp4 and none")
    assert rc == 0 and "1/6 tests collected (5 deselected)" in out, out


def test_zero_selected_cases_is_an_error(tmp_path, tiny):
    rc, out = run_pytest(tmp_path, "--scenario", "tiny", "--scenario-dir", str(tiny),
                         "-k", "no_such_case")
    assert rc == 4
    assert "selected zero cases" in out


def test_max_world_size_skips_with_reason(tmp_path, tiny):
    rc, out = run_pytest(tmp_path, "--scenario", "tiny", "--scenario-dir", str(tiny),
                         "--max-world-size", "2", "-k", "to_dp4 and none", "-rs", "--no-report")
    assert rc == 0, out
    assert "needs 4 ranks; --max-world-size / available ranks: 2" in out


@pytest.mark.integration
def test_xfail_registry_outcomes_and_reports(tmp_path, tiny, monkeypatch):
    (tiny / "xfails.yaml").write_text(REGISTRY)
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # a user's CUDA setting: recorded
    reports = tmp_path / "reports"
    rc, out = run_pytest(tmp_path, "--scenario", "tiny", "--scenario-dir", str(tiny),
                         "--report-dir", str(reports), "--junitxml", str(tmp_path / "j.xml"), "-rxXf",
                         *FORK)
    assert rc == 1, out
    # entry 1: fails as registered -> XFAIL
    assert "XFAIL scen/tiny.yaml::tiny[fp32-dp2-LayerNormMLP-sync-none-perturb_reference]" in out
    # entry 2: passes -> strict XPASS fails, telling which entry to remove
    assert "[XPASS(strict)] xfail entry 2" in out and "remove xfail entry 2" in out
    # entry 3: fails, but not the way the entry says -> a real failure
    assert "xfail entry 3 (xfails.yaml line 10) names fp32_parity failing, but fp32_parity ran " \
           "and passed: remove it from entry 3" in out
    assert "not explained by any entry: dcp_roundtrip/state" in out
    assert "repro: pytest --scenario tiny" in out
    # entry 4 explains dcp_roundtrip, not the reshard failure of the same bug: the sync case
    # FAILS naming both; entry 5 also names reshard for the async case: XFAIL
    sync_fail = out[out.index("tiny[fp32-dp2-LayerNormMLP-sync-to_dp4-perturb_loaded] _"):]
    assert "entry 4 explains dcp_roundtrip\n" in sync_fail
    assert "not explained by any entry: reshard/state" in sync_fail
    assert "XFAIL scen/tiny.yaml::tiny[fp32-dp2-LayerNormMLP-async_thread-to_dp4-perturb_loaded]" in out
    assert "outcomes: 1 passed, 2 failed, 2 xfailed, 1 xpassed, 0 skipped" in out
    assert "torchrun launches: 2 (1 x world 2, 1 x world 4)" in out
    df = pd.read_parquet(next((reports / "history").glob("*.parquet")))
    cases = df[df["check"] == "case"].set_index("case_id")["case_outcome"]
    assert cases["tiny[fp32-dp2-LayerNormMLP-sync-none-perturb_reference]"] == "xfailed"
    assert cases["tiny[fp32-dp2-LayerNormMLP-sync-none-none]"] == "xpassed"
    assert cases["tiny[fp32-dp2-LayerNormMLP-sync-none-skip_load]"] == "failed"
    assert cases["tiny[fp32-dp2-LayerNormMLP-sync-to_dp4-none]"] == "passed"
    # coverage: one row per case and unit; the verdict turns explained failures into xfailed
    cov = df[df["metric"] == "coverage"].set_index(["case_id", "check"])["row_outcome"]
    sync, asy = ("tiny[fp32-dp2-LayerNormMLP-sync-to_dp4-perturb_loaded]",
                 "tiny[fp32-dp2-LayerNormMLP-async_thread-to_dp4-perturb_loaded]")
    assert cov[(sync, "dcp_roundtrip")] == "xfailed" and cov[(sync, "reshard")] == "failed"
    assert cov[(asy, "reshard")] == "xfailed" and cov[(asy, "async_equivalence")] == "passed"
    assert cov[(sync, "train")] == "passed" and cov[(sync, "fp32_parity")] == "passed"
    summary = pd.read_csv(next((reports / "runs").glob("*/summary.csv"))).set_index("case_id")
    assert summary.loc[sync, "reshard"] == "failed" and summary.loc[sync, "dcp_roundtrip"] == "xfailed"
    reshard = df[(df["check"] == "reshard") & (df["case_id"].str.endswith("to_dp4-none]"))
                 & (df["metric"] != "coverage") & (df["quantity"] != "time")]
    assert set(reshard["quantity"]) == {"state", "next_loss", "next_params"}
    assert (reshard["row_outcome"] == "pass").all()
    assert {"torch_version", "git_sha", "date"} <= set(df.columns)
    assert (tmp_path / "j.xml").read_text().count("<testcase") == 6
    # the ranks' CUDA / cuBLAS / NCCL / TE / torch variables, the user's and the harness's own
    meta = json.loads(next((reports / "runs").glob("*/meta.json")).read_text())
    assert meta["rank_env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert meta["rank_env"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert not {"HOME", "PATH", "PYTHONPATH"} & set(meta["rank_env"])


@pytest.mark.integration
def test_xdist_runs_groups_on_workers(tmp_path, tiny):
    pytest.importorskip("xdist")
    reports = tmp_path / "reports"
    rc, out = run_pytest(tmp_path, "--scenario", "tiny", "--scenario-dir", str(tiny), "-n", "2",
                         "--report-dir", str(reports), "-k", "not perturb", *FORK)
    assert rc == 1, out
    assert "1 failed, 2 passed" in out
    df = pd.read_parquet(next((reports / "history").glob("*.parquet")))
    outcomes = df[df["check"] == "case"].set_index("case_id")["case_outcome"]
    assert outcomes.to_dict() == {"tiny[fp32-dp2-LayerNormMLP-sync-none-none]": "passed",
                                  "tiny[fp32-dp2-LayerNormMLP-sync-to_dp4-none]": "passed",
                                  "tiny[fp32-dp2-LayerNormMLP-sync-none-skip_load]": "failed"}
    # the failure names its launches under the directory they are in (a worker's own)
    names, under = re.search(r"launches: (.+) under (\S+)", out).groups()
    assert under.split("/")[-1] in ("gw0", "gw1")
    assert all((Path(under) / n / "torchrun.log").is_file() for n in names.split(", ")), out


def test_world_size_selects_one_shard(tmp_path, tiny):
    rc, out = run_pytest(tmp_path, "--scenario", "tiny", "--scenario-dir", str(tiny),
                         "--collect-only", "-q", "--world-size", "4")
    assert rc == 0, out
    assert "tiny[fp32-dp2-LayerNormMLP-sync-to_dp4-none]" in out
    assert "3/6 tests collected (3 deselected)" in out


def test_unrelated_path_args_still_run_the_scenario(tmp_path, tiny):
    other = tmp_path / "unrelated"
    other.mkdir()
    rc, out = run_pytest(tmp_path, "--scenario", "tiny", "--scenario-dir", str(tiny),
                         "--collect-only", "-q", str(other))
    assert rc == 0, out
    assert "6 tests collected" in out


def test_a_repro_names_a_scenario_file_given_by_its_path(tmp_path):
    """A user's scenario given by path (`--scenario path/to/x.yaml`) is rerun by that path: by
    its name it would be looked up in the scenario dir, where it is not."""
    from types import SimpleNamespace

    from harness.plugin.failure_text import FailureFormatter
    root, own = tmp_path / "repo", tmp_path / "mine" / "u.yaml"
    item = SimpleNamespace(case=SimpleNamespace(scenario="u", id="u[fp32-dp3]"))
    f = FailureFormatter(root, root / "scenarios", "torch", "cpu", tmp_path, {"u": own})
    assert f.repro(item).startswith(f"pytest --scenario {own} --backend torch --device cpu")
    shipped = FailureFormatter(root, root / "scenarios", "torch", "cpu", tmp_path,
                               {"u": root / "scenarios" / "u.yaml"})
    assert shipped.repro(item).startswith("pytest --scenario u --backend torch")
