"""TorchInductor's on-disk caches for the ranks, kept across launches and runs.

TE compiles some fused functions with ``torch.compile`` (``transformer_engine.pytorch.jit``):
the first case of each module in every rank pays Dynamo, AOT autograd and Inductor for them.
Inductor keeps its FX-graph and kernel caches under ``tempfile.gettempdir()`` unless told
otherwise, and each launch's processes get a ``TMPDIR`` of their own (removed with them,
harness/launch/launch.py): every launch compiled the same kernels again. The ranks now use
``$XDG_CACHE_HOME/fsdp2-harness/inductor`` (a cache the user set is kept). Inductor's caches are
keyed by everything that determines the code (graph, torch version, configuration, device); a
hit gives the code a compile would (its own tests' contract), so what the cases check is
unchanged.

``TORCHINDUCTOR_COMPILE_THREADS=1`` (unless set): by default each rank may start a pool of
compile worker processes (as many as the host has cores, each importing torch) for a handful
of tiny kernels, while the ranks of several launches share those cores. The kernels are the
same either way, and for so few a pool gains nothing.

Whether the user chose is read from the environment as this module was imported (with the
plugin, before anything imports torch): importing ``torch._dynamo`` writes Inductor's default
(``/tmp/torchinductor_<user>``) into ``os.environ`` (torch 2.11 and 2.13), which read later
looks like the user's choice -- every launch's ranks would use it and this directory never.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_VAR, THREADS_VAR = "TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_COMPILE_THREADS"
# the user's own settings, read before torch's import can write its defaults into os.environ
USER_SETTINGS = {v: os.environ.get(v) for v in (CACHE_VAR, THREADS_VAR)}


def cache_path(env, name: str) -> Path:
    """The harness's cache ``name`` for a process of environment ``env`` (not made):
    ``$XDG_CACHE_HOME/fsdp2-harness/<name>``, else under ``$HOME/.cache``."""
    root = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else \
        Path(env.get("HOME") or Path.home()) / ".cache"
    return root / "fsdp2-harness" / name


def cache_dir(env, name: str) -> Path | None:
    """:func:`cache_path` (made), or None where it cannot be made."""
    root = cache_path(env, name)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return root


def worker_env(env: dict, extra_env: dict | None = None) -> dict:
    """The variables a rank's environment gets: ours where the user set none -- in the
    environment as the harness was imported (:data:`USER_SETTINGS`) or in a launch's
    ``extra_env`` --, whatever ``env`` holds by now (torch's import may have written its
    default there)."""
    user = {**USER_SETTINGS,
            **{k: v for k, v in (extra_env or {}).items() if k in USER_SETTINGS}}
    out = {}
    if not user.get(CACHE_VAR):
        root = cache_dir(env, "inductor")  # None: what env holds, else Inductor's default
        if root is not None:
            out[CACHE_VAR] = str(root)
    if not user.get(THREADS_VAR):
        out[THREADS_VAR] = "1"
    return out
