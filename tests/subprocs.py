"""Test helpers: a pytest run with the harness plugin in a subprocess (a fresh interpreter,
real launches), and several processes at once, each wait bounded, none left behind."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pytest_argv(*args: str) -> list[str]:
    """``python -m pytest`` with the harness plugin (and no cache) and ``args``."""
    return [sys.executable, "-m", "pytest", "-p", "harness.plugin", "-p", "no:cacheprovider",
            *args]


def harness_env() -> dict:
    """This environment with the harness importable."""
    return {**os.environ, "PYTHONPATH": str(ROOT)}


ONE_CASE = """\
name: {name}
description: {description}
axes:
  recipe: [fp32]
  mesh: [dp2]
  module: [Linear]
  dcp: [{dcp}]
  reshard: [none]
timeout_s: 120
"""


def one_case_scenario(tmp_path, name: str, description: str, dcp: str = "sync") -> Path:
    """A scenario directory under ``tmp_path`` holding ``<name>.yaml``: one fp32 dp2 Linear
    case saved with ``dcp``, for tests that need a real run of a single case."""
    scen = tmp_path / "scen"
    scen.mkdir(exist_ok=True)
    (scen / f"{name}.yaml").write_text(ONE_CASE.format(name=name, description=description,
                                                       dcp=dcp))
    return scen


def run_pytest(cwd, *args: str, timeout: float = 600) -> tuple[int, str]:
    """(return code, stdout + stderr) of :func:`pytest_argv` run in ``cwd``."""
    p = subprocess.run(pytest_argv(*args), cwd=cwd, env=harness_env(), capture_output=True,
                       text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def run_all(argvs: list[list[str]], timeout: float, **popen) -> list[tuple[int, str]]:
    """Start every argv, wait for each up to ``timeout`` seconds (TimeoutExpired otherwise),
    kill whatever still runs; (return code, stdout + stderr) per process."""
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              **popen) for a in argvs]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    return [(p.returncode, out) for p, out in zip(procs, outs)]
