"""Results live in a store outside git (harness/results/store.py): which directory a run and the
tools use, and a clean checkout -- only the tracked files -- rendering the dashboard and judging
drift from a store directory, writing nothing into the checkout."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from synth_history import drifting_history

from harness.__main__ import main
from harness.results import store

ROOT = Path(__file__).resolve().parents[2]


def test_store_is_the_given_dir_else_the_env_var_else_reports(tmp_path, monkeypatch):
    monkeypatch.delenv(store.ENV, raising=False)
    assert store.store_dir() == Path("reports")
    assert store.store_dir(base=tmp_path) == tmp_path / "reports"
    assert store.run_store(None, tmp_path / "root", tmp_path) == tmp_path / "root" / "reports"
    monkeypatch.setenv(store.ENV, "runs/store")
    assert store.store_dir(base=tmp_path) == tmp_path / "runs" / "store"
    assert store.run_store(None, tmp_path / "root", tmp_path) == tmp_path / "runs" / "store"
    assert store.run_store("mine", tmp_path / "root", tmp_path) == tmp_path / "mine"
    assert store.store_dir(tmp_path / "given") == tmp_path / "given"  # given wins
    monkeypatch.setenv(store.ENV, "~/results")
    assert store.store_dir() == Path.home() / "results"
    assert store.history_dir(tmp_path) == tmp_path / "history"


def test_report_and_drift_read_the_store_from_the_env_var(tmp_path, monkeypatch, capsys):
    s = tmp_path / "store"
    (s / "history").mkdir(parents=True)
    drifting_history(s)
    monkeypatch.setenv(store.ENV, str(s))
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 0  # the dashboard goes into the store by default
    assert (s / "report.html").stat().st_size > 10_000
    assert main(["drift", "--fail-on-drift"]) == 1  # drifting_history's drifting series
    assert "flagged" in capsys.readouterr().out
    monkeypatch.delenv(store.ENV)
    assert main(["drift"]) == 2  # no store under ./reports here: nothing to judge
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()


def _tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True,
                         timeout=60)
    if out.returncode != 0:
        pytest.skip(f"git ls-files failed: {out.stderr.decode()[-300:]}")
    return [f for f in out.stdout.decode().split("\0") if f and (ROOT / f).is_file()]


def _listing(d: Path) -> set[Path]:
    return {p.relative_to(d) for p in d.rglob("*") if "__pycache__" not in p.parts}


def test_clean_checkout_renders_dashboard_and_drift_from_a_store(tmp_path):
    """A checkout of only the tracked files (what a fresh clone has) holds no results; pointed
    at a store directory it renders the dashboard and runs drift, and leaves the checkout as
    it was (no history, report or run folder written into it)."""
    clone = tmp_path / "clone"
    for f in _tracked_files():
        (clone / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, clone / f)
    # results are not in the tree: only calibration runs under reports/
    assert sorted(p.name for p in (clone / "reports").iterdir()) == ["calibration"]
    s = tmp_path / "store"
    (s / "history").mkdir(parents=True)
    drifting_history(s, drift=False)
    before = _listing(clone)
    env = {k: v for k, v in os.environ.items() if k not in (store.ENV, "PYTHONPATH")}
    env.update(PYTHONPATH=str(clone), PYTHONDONTWRITEBYTECODE="1")

    def harness(*args, **extra):
        return subprocess.run([sys.executable, "-m", "harness", *args], cwd=clone,
                              env={**env, **extra}, capture_output=True, text=True, timeout=240)

    rep = harness("report", "--store", str(s))
    assert rep.returncode == 0, rep.stderr
    assert f"wrote {s / 'report.html'}" in rep.stdout
    page = (s / "report.html").read_text()
    assert "Distributed correctness report" in page and "drift" in page
    dr = harness("drift", "--fail-on-drift", **{store.ENV: str(s)})
    assert dr.returncode == 0, dr.stdout + dr.stderr
    assert "0 flagged" in dr.stdout
    assert _listing(clone) == before, sorted(map(str, _listing(clone) - before))


def test_no_results_are_tracked_and_a_clone_stays_small():
    """Only calibration runs (read by ``python -m harness calibrate``) are tracked under
    reports/; the tracked files of a fresh clone stay under 5 MB."""
    files = _tracked_files()
    assert [f for f in files if f.startswith("reports/")
            and not f.startswith("reports/calibration/")] == []
    size = sum((ROOT / f).stat().st_size for f in files)
    assert size < 5_000_000, f"tracked files: {size / 1e6:.1f} MB"
