"""Issue 61: the self-tests leave nothing under pytest's basetemp when they pass (the sized-bug
tests alone left ~327 MB of launches and checkpoints per run): the project's pytest settings
(pyproject.toml, ``tmp_path_retention_policy``) make a passing session remove its basetemp."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

INNER = '''
import pytest


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    d = tmp_path_factory.mktemp("shared")
    (d / "launch.bin").write_bytes(b"x" * 100_000)
    return d


def test_writes(tmp_path, shared):
    (tmp_path / "ckpt.bin").write_bytes(b"x" * 100_000)
'''


def test_a_passing_session_leaves_no_temporary_files(tmp_path):
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "test_inner.py").write_text(INNER)
    temproot = tmp_path / "temproot"
    temproot.mkdir()
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path / "inner"),
                        str(tmp_path / "inner" / "test_inner.py")],
                       env={**os.environ, "PYTEST_DEBUG_TEMPROOT": str(temproot)},
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0 and "1 passed" in p.stdout, p.stdout + p.stderr
    left = [str(f.relative_to(temproot)) for f in temproot.rglob("*") if f.is_file()]
    assert left == [], left
