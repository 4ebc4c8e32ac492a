"""Python's bytecode for the harness's own processes, where Python may not write it beside the
sources.

GPU images often ship torch without bytecode (``.pyc``) and set ``PYTHONDONTWRITEBYTECODE=1``:
then every Python a run starts -- pytest, the rank server, torchrun's agents, fresh ranks, DCP's
stagers -- compiles torch's modules from source at every import (docs/findings.md). Where
Python may not write bytecode (``-B`` or ``PYTHONDONTWRITEBYTECODE``) and torch's bytecode is not
where Python looks for it -- beside its sources, or under a cache prefix you set (``-X
pycache_prefix`` or ``PYTHONPYCACHEPREFIX``: a prefix Python may not write to stays empty, and
every process compiles torch again, docs/findings.md) -- the harness's processes keep it in a
cache of their own,
``$XDG_CACHE_HOME/fsdp2-harness/pycache`` (beside the Inductor cache, ``inductor_cache.py``):
the pytest process sets ``sys.pycache_prefix`` and lets Python write (:func:`apply`, from the
plugin's ``pytest_configure``); every launch's environment gets ``PYTHONPYCACHEPREFIX`` and
loses ``PYTHONDONTWRITEBYTECODE`` (:func:`launch_env`, from ``launch.run_env``). The user's
shell and the installed packages' directories are untouched; a cache that cannot be made or
written leaves everything as it was. ``multiprocessing`` starts the rank server with pytest's
``-B``: its preload writes the cache all the same (:func:`follow`); processes spawned with that
flag after it (a forked rank's DCP stager spawned, not forked) read the cache, write nothing.

Where torch has its bytecode where Python looks for it (beside its sources: ``ci/setup.sh``
installs so; or under your prefix) nothing changes: a prefix of the harness's would make Python
look for bytecode only under it, so every process would compile torch again until the cache is
filled -- on a fresh CI VM, every run. A ``.pyc`` is keyed by its source's
modification time and size and written atomically, so a stale or half-written one is never
used: what the processes run is the same code.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path

from harness.speed import inductor_cache, layers

PREFIX_VAR, NO_WRITE_VAR = "PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE"
MARK_VAR = "HARNESS_PYCACHE"  # a launch's environment: the cache this layer gave it
# how Python started this process (the user's choice), read before :func:`apply` changes it
STARTED = {"dont_write": bool(sys.flags.dont_write_bytecode), "prefix": sys.pycache_prefix}
_before: list[tuple] = []  # (sys.pycache_prefix, sys.dont_write_bytecode) before apply()


def plan(env, dont_write: bool, torch_bytecode: bool) -> Path | None:
    """Where the harness's processes keep bytecode, or None where Python's own way stands: the
    cache directory (not made here) where Python may not write bytecode (``dont_write``: its
    ``-B`` flag; or ``PYTHONDONTWRITEBYTECODE`` in ``env``) and torch has no bytecode where
    this Python looks for it (``torch_bytecode``: :func:`shipped` under the prefix in force)."""
    if torch_bytecode or not (dont_write or env.get(NO_WRITE_VAR)):
        return None
    return inductor_cache.cache_path(env, "pycache")  # beside the Inductor cache


@functools.lru_cache(maxsize=None)
def shipped(module: str = "torch", prefix: str | None = None) -> bool:
    """Whether ``module`` (not imported) has its bytecode where a Python with cache prefix
    ``prefix`` (None: none) reads it: a ``.pyc`` beside its source in ``__pycache__``, or under
    the prefix at the source's directory path; or no source at all. True where this Python
    caches no bytecode (nothing to gain), False where the module cannot be found."""
    if sys.implementation.cache_tag is None:
        return True
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    origin = spec.origin if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return bool(origin) and origin.endswith(".pyc")
    src = Path(os.path.abspath(origin))  # as Python joins it to a prefix (not resolved)
    name = f"{src.stem}.{sys.implementation.cache_tag}.pyc"
    where = (Path(prefix) / src.parent.relative_to(src.anchor) if prefix
             else src.parent / "__pycache__")
    return (where / name).is_file()


def own_cache(env=None) -> Path | None:
    """:func:`plan` for ``env`` (default ``os.environ``) and this process as Python started it:
    the cache, made; None where the plan is Python's way or the cache cannot be made or
    written (the layer then does nothing)."""
    env = os.environ if env is None else env
    prefix = STARTED["prefix"] or env.get(PREFIX_VAR) or None
    d = plan(env, STARTED["dont_write"], shipped("torch", prefix))
    if d is None:
        return None
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return d if os.access(d, os.W_OK | os.X_OK) else None


def with_cache(env: dict, cache: Path | str) -> dict:
    """``env`` for a process that keeps its bytecode in ``cache`` (and writes it)."""
    out = {k: v for k, v in env.items() if k != NO_WRITE_VAR}
    out[PREFIX_VAR] = out[MARK_VAR] = str(cache)
    return out


def launch_env(env: dict) -> dict:
    """A launch's environment ``env`` with the harness's cache where the layer is on (the
    choice ``env`` carries, ``layers.from_env``) and :func:`own_cache` gives one, else ``env``
    unchanged."""
    cache = own_cache(env) if "bytecode_cache" in layers.from_env(env) else None
    return env if cache is None else with_cache(env, cache)


def apply(env=None) -> Path | None:
    """This process (pytest, from the plugin's configure) keeps its bytecode in
    :func:`own_cache` from now on: the imports after this one are compiled once per run and
    machine, not once per process. Returns the cache, or None (nothing changed)."""
    cache = own_cache(env)
    if cache is not None and not _before:
        _before.append((sys.pycache_prefix, sys.dont_write_bytecode))
        sys.pycache_prefix, sys.dont_write_bytecode = str(cache), False
    return cache


def undo() -> None:
    """What :func:`apply` changed back as it was (a pytest run inside another process)."""
    if _before:
        sys.pycache_prefix, sys.dont_write_bytecode = _before.pop()


def follow() -> None:
    """A process started with the harness's cache in its environment writes bytecode there even
    where a flag says not to: ``multiprocessing`` starts the rank server with pytest's ``-B``."""
    cache = os.environ.get(MARK_VAR)
    if cache and os.environ.get(PREFIX_VAR) == cache and sys.pycache_prefix:
        sys.dont_write_bytecode = False


def describe(env: dict) -> str:
    """The run's meta: whether a launch environment ``env`` has the harness's cache."""
    cache = env.get(MARK_VAR)
    return f"own cache {cache}" if cache and env.get(PREFIX_VAR) == cache else \
        "as the environment says"
