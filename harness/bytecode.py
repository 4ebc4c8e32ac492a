"""Where compiled bytecode goes when it cannot sit next to the sources.

Every process of a run imports torch (and TE): pytest itself, each torchrun agent and each rank.
With ``PYTHONDONTWRITEBYTECODE`` set (common in containers) or a site-packages without
``__pycache__`` (read-only, or installed with ``--no-compile``), each of them compiles thousands
of modules every time: measured on 2x H200, 14 s of ``compile()`` in the two ranks of one launch,
and 5.8 s in pytest's own ``--collect-only`` of the TE matrix. There the harness's processes read
and write bytecode under ``$XDG_CACHE_HOME/fsdp2-harness/pycache`` (Python's
``pycache_prefix``): only its own processes, never beside the sources; a prefix the user set is
kept, and nothing changes where bytecode already works.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path


def _torch_has_bytecode() -> bool:
    spec = importlib.util.find_spec("torch")  # finds the package without importing it
    return bool(spec and spec.origin and has_bytecode_beside(spec.origin))


def has_bytecode_beside(source: str) -> bool:
    """Whether the module at ``source`` has its bytecode in the ``__pycache__`` beside it (an
    install that compiled it) -- not in this process's own cache: once ``use_here`` set
    ``sys.pycache_prefix``, ``importlib.util.cache_from_source`` would name the cache's copy."""
    head, tail = os.path.split(source)
    opt = f".opt-{sys.flags.optimize}" if sys.flags.optimize else ""
    name = f"{tail.rpartition('.')[0]}.{sys.implementation.cache_tag}{opt}.pyc"
    return os.path.exists(os.path.join(head, "__pycache__", name))


def _needed(prefix, dont_write) -> bool:
    """No prefix chosen, and bytecode cannot be written, or torch has none beside it."""
    return not prefix and bool(dont_write or not _torch_has_bytecode())


def cache_dir(env, name: str) -> Path | None:
    """``$XDG_CACHE_HOME/fsdp2-harness/<name>`` (made), or None where it cannot be made."""
    root = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fsdp2-harness" / name
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return root


def worker_env(env: dict) -> dict:
    """The variables that give a launched process (agent, rank) the cache; {} if not needed."""
    if not _needed(env.get("PYTHONPYCACHEPREFIX"), env.get("PYTHONDONTWRITEBYTECODE")):
        return {}
    root = cache_dir(env, "pycache")
    if root is None:
        return {}
    out = {"PYTHONPYCACHEPREFIX": str(root)}
    if env.get("PYTHONDONTWRITEBYTECODE"):
        out["PYTHONDONTWRITEBYTECODE"] = ""  # empty: unset for Python
    return out


def use_here() -> bool:
    """The same cache for this process (pytest), from here on: call it before torch is
    imported. Returns whether it was turned on."""
    if "torch" in sys.modules or not _needed(sys.pycache_prefix, sys.dont_write_bytecode):
        return False
    root = cache_dir(os.environ, "pycache")
    if root is None:
        return False
    sys.pycache_prefix = str(root)
    sys.dont_write_bytecode = False
    return True
