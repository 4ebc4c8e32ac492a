"""The harness's own bytecode cache (harness/speed/bytecode_cache.py): where Python may not write
bytecode, no cache prefix is set and torch has none beside its sources, pytest and every
process it starts keep bytecode in ``$XDG_CACHE_HOME/fsdp2-harness/pycache``; otherwise, with
the layer off, or where the cache cannot be made, nothing changes."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from subprocs import ROOT, harness_env, one_case_scenario

from harness.launch.feed import FixedFeed
from harness.launch.launch import run_env
from harness.launch.launcher import Launcher
from harness.plugin import execution
from harness.speed import bytecode_cache as bc
from harness.speed import layers

NO_WRITE, PREFIX = bc.NO_WRITE_VAR, bc.PREFIX_VAR


def test_the_plan_keeps_python_s_way_unless_it_may_not_write_and_torch_has_no_bytecode():
    home = {"HOME": "/h"}
    cache = Path("/h/.cache/fsdp2-harness/pycache")
    assert bc.plan({**home, NO_WRITE: "1"}, False, False) == cache
    assert bc.plan(home, True, False) == cache  # python -B
    assert bc.plan({NO_WRITE: "1", "XDG_CACHE_HOME": "/x", **home}, False, False) == \
        Path("/x/fsdp2-harness/pycache")
    assert bc.plan(home, False, False) is None  # Python writes bytecode: its way
    assert bc.plan({**home, NO_WRITE: ""}, False, False) is None  # empty: not set
    # torch's bytecode where Python looks for it (beside its sources, or under the user's
    # prefix): a prefix of ours would hide it (every process compiles torch until it is filled)
    assert bc.plan({**home, NO_WRITE: "1"}, True, True) is None


def test_a_module_with_bytecode_beside_its_source_is_shipped(tmp_path, monkeypatch):
    (tmp_path / "plain_mod.py").write_text("X = 1\n")
    (tmp_path / "built_mod.py").write_text("X = 1\n")
    (tmp_path / "__pycache__").mkdir()
    pyc = f"built_mod.{sys.implementation.cache_tag}.pyc"
    (tmp_path / "__pycache__" / pyc).write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    shipped = bc.shipped.__wrapped__  # not the run's cached answer
    assert shipped("built_mod") and not shipped("plain_mod")
    assert not shipped("no_such_module_here")
    # under a prefix Python reads <prefix>/<the source's directory>/, never __pycache__
    prefix = tmp_path / "prefix"
    assert not shipped("built_mod", str(prefix))
    under = prefix / Path(os.path.abspath(tmp_path)).relative_to("/")
    under.mkdir(parents=True)
    (under / f"plain_mod.{sys.implementation.cache_tag}.pyc").write_bytes(b"")
    assert shipped("plain_mod", str(prefix))


@pytest.fixture
def no_bytecode(tmp_path, monkeypatch):
    """This process as an image without bytecode starts it: PYTHONDONTWRITEBYTECODE set, no
    prefix, torch without bytecode; the caches under ``tmp_path/xdg``. The cache's path."""
    monkeypatch.setattr(bc, "STARTED", {"dont_write": False, "prefix": None})
    monkeypatch.setattr(bc, "shipped", lambda module="torch", prefix=None: False)
    monkeypatch.setenv(NO_WRITE, "1")
    monkeypatch.delenv(PREFIX, raising=False)
    monkeypatch.delenv(layers.VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "fsdp2-harness" / "pycache"


def _rank_env(tmp_path, acc: str | None = None) -> dict:
    """The environment a launch's agents and ranks get (``Launch._env``)."""
    env = layers.parse(acc).env() if acc else None
    launcher = Launcher(tmp_path / "launches" / (acc or "default"), "reference", "cpu", env=env)
    feed = FixedFeed([])
    feed.timeout_s = 60.0  # the largest case timeout it may see
    launch = launcher._launch([], 2, {}, feed, retry_start=True)
    launch.tmp = str(tmp_path / "tmp")
    return launch._env()


def test_the_ranks_get_the_cache_where_python_may_not_write(tmp_path, no_bytecode):
    env = _rank_env(tmp_path)
    assert env[PREFIX] == str(no_bytecode) and NO_WRITE not in env
    assert no_bytecode.is_dir()
    assert bc.describe(env) == f"own cache {no_bytecode}"
    server = run_env("cpu", layers.ALL.env())  # the rank server's (plugin/execution.py)
    assert server[PREFIX] == str(no_bytecode) and NO_WRITE not in server
    assert os.environ[NO_WRITE] == "1" and PREFIX not in os.environ  # pytest's own: untouched


@pytest.mark.parametrize("acc", ["all,-bytecode_cache", "none"])
def test_the_layer_off_leaves_the_environment_as_it_is(tmp_path, no_bytecode, acc):
    env = _rank_env(tmp_path, acc)
    assert env[NO_WRITE] == "1" and PREFIX not in env and bc.MARK_VAR not in env
    assert bc.describe(env) == "as the environment says"
    assert not no_bytecode.exists()


def test_a_prefix_that_holds_torch_s_bytecode_or_bytecode_allowed_is_kept(tmp_path, no_bytecode,
                                                                          monkeypatch):
    monkeypatch.setattr(bc, "shipped", lambda module="torch", prefix=None: prefix == "/full")
    monkeypatch.setenv(PREFIX, "/full")
    env = _rank_env(tmp_path / "a")
    assert env[PREFIX] == "/full" and env[NO_WRITE] == "1" and bc.MARK_VAR not in env
    monkeypatch.delenv(PREFIX)
    monkeypatch.setattr(bc, "STARTED", {"dont_write": True, "prefix": "/full"})  # -X
    env = _rank_env(tmp_path / "b")
    assert PREFIX not in env and env[NO_WRITE] == "1"
    monkeypatch.setattr(bc, "STARTED", {"dont_write": False, "prefix": None})
    monkeypatch.delenv(NO_WRITE)
    env = _rank_env(tmp_path / "c")
    assert PREFIX not in env and NO_WRITE not in env
    assert not no_bytecode.exists()


def test_a_prefix_python_may_not_write_to_gets_the_harness_s_cache(tmp_path, no_bytecode,
                                                                   monkeypatch):
    """PYTHONPYCACHEPREFIX set where PYTHONDONTWRITEBYTECODE is too (the lent GPU image): the
    prefix stays empty and every process compiled torch from source (what that cost:
    docs/findings.md)."""
    monkeypatch.setenv(PREFIX, "/empty")
    env = _rank_env(tmp_path)
    assert env[PREFIX] == str(no_bytecode) and NO_WRITE not in env
    assert bc.describe(env) == f"own cache {no_bytecode}"
    assert os.environ[PREFIX] == "/empty"  # pytest's own environment: untouched


def test_a_cache_that_cannot_be_made_changes_nothing(tmp_path, no_bytecode, monkeypatch):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a_file"))  # no directory under a file
    assert bc.own_cache() is None and bc.apply() is None
    env = _rank_env(tmp_path)
    assert env[NO_WRITE] == "1" and PREFIX not in env


def test_the_pytest_process_keeps_its_bytecode_there(no_bytecode, monkeypatch):
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert bc.apply() == no_bytecode
    assert sys.pycache_prefix == str(no_bytecode) and not sys.dont_write_bytecode
    bc.undo()
    assert sys.pycache_prefix is None and sys.dont_write_bytecode


def test_the_run_meta_says_where_the_bytecode_went(tmp_path, no_bytecode):
    def meta(acc):
        opts = {"accelerations": acc, "rank_start": "fresh", "launches_per_gpu": None,
                "nnodes": 1, "node_launcher": None}
        hs = SimpleNamespace(device="cpu", execution=None, env=None,
                             config=SimpleNamespace(getoption=opts.get, cache={}))
        return execution.execution_meta(hs, [])["bytecode"]
    assert meta("all") == f"own cache {no_bytecode}"
    assert meta("all,-bytecode_cache") == meta("none") == "as the environment says"


IMPORT = "import tiny_mod_for_pyc"


def _pycs(root: Path) -> list[Path]:
    return sorted(root.rglob("tiny_mod_for_pyc.*.pyc")) if root.exists() else []


def _import(tmp_path, env: dict, *flags: str, code: str = IMPORT) -> None:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "tiny_mod_for_pyc.py").write_text("VALUE = 42\n")
    env = {**env, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)])}
    out = subprocess.run([sys.executable, *flags, "-c", code], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_a_process_given_the_launch_environment_writes_its_bytecode_there(tmp_path,
                                                                         no_bytecode):
    """``python -c`` under PYTHONDONTWRITEBYTECODE=1 writes no bytecode; with the environment
    the harness gives a launch it writes it under the cache, and nothing beside the source."""
    plain = run_env("cpu", layers.parse("all,-bytecode_cache").env())
    assert plain[NO_WRITE] == "1"
    _import(tmp_path, plain)
    assert not _pycs(tmp_path)  # the control: Python's way writes nothing
    _import(tmp_path, run_env("cpu", layers.ALL.env()))
    pycs = _pycs(tmp_path)
    assert pycs and all(p.is_relative_to(no_bytecode) for p in pycs), pycs


def test_the_rank_server_writes_there_despite_pytest_s_b_flag(tmp_path, no_bytecode):
    """multiprocessing starts the rank server with pytest's ``-B``: its preload follows the
    environment (``follow``) before it imports torch and the backend."""
    env = run_env("cpu", layers.ALL.env())
    _import(tmp_path, env, "-B")
    assert not _pycs(tmp_path)  # -B alone: nothing written
    _import(tmp_path, env, "-B", code="from harness.speed import bytecode_cache as b\n"
                                      "b.follow()\n" + IMPORT)
    assert _pycs(no_bytecode)
    # the server's preload follows before it imports what the ranks need
    for p in _pycs(no_bytecode):
        p.unlink()
    preload = ("from harness.launch import fork_agent\n"
               "fork_agent.preload = lambda backend: __import__('tiny_mod_for_pyc')\n"
               "fork_agent.preload_from_env()\n"
               "assert fork_agent.ERROR is None, fork_agent.ERROR\n")
    _import(tmp_path, env, "-B", code=preload)
    assert _pycs(no_bytecode)
    # a -B process without the harness's cache in its environment keeps its flag
    (tmp_path / "other").mkdir()
    plain = run_env("cpu", layers.PLAIN.env())
    _import(tmp_path / "other", plain, "-B", code="from harness.speed import bytecode_cache as b\n"
                                                  "b.follow()\nimport sys\n"
                                                  "assert sys.dont_write_bytecode\n" + IMPORT)


PYTEST_RUN = """
import json, sys
import torch  # imported before the plugin's configure: what is imported after benefits
from harness.speed import bytecode_cache
bytecode_cache.shipped = lambda module="torch", prefix=None: False  # an image without it
import pytest
seen = {}
class Probe:
    def pytest_collection_finish(self, session):
        seen.update(prefix=sys.pycache_prefix, dont_write=sys.dont_write_bytecode)
rc = pytest.main(sys.argv[1:], plugins=[Probe()])
seen.update(rc=int(rc), after=sys.pycache_prefix)
print(json.dumps(seen))
"""


def test_pytest_keeps_its_bytecode_in_the_cache_from_configure(tmp_path):
    """A run (collection only) under PYTHONDONTWRITEBYTECODE=1: from the plugin's configure
    pytest writes what it imports (the backend's modules) to the cache; back as it was after."""
    scen = one_case_scenario(tmp_path, "pyc", "bytecode cache")
    env = {**harness_env(), NO_WRITE: "1", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    env.pop(PREFIX, None)
    env.pop(layers.VAR, None)
    argv = ["-p", "harness.plugin", "-p", "no:cacheprovider", "--scenario", "pyc",
            "--scenario-dir", str(scen), "--collect-only", "-q", "--no-report"]
    out = subprocess.run([sys.executable, "-c", PYTEST_RUN, *argv], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    cache = tmp_path / "xdg" / "fsdp2-harness" / "pycache"
    assert seen == {"prefix": str(cache), "dont_write": False, "rc": 0, "after": None}
    backends = cache / str(ROOT / "harness" / "backends").lstrip(os.sep)
    assert list(backends.glob("*.pyc")), sorted(cache.rglob("*.pyc"))[:5]
