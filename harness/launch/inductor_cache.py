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
same either way; on 1x H200 (16 cores, warm cache) 16 threads measured no different from 1
(reports/bench/README.md).
"""

from __future__ import annotations

from pathlib import Path


def cache_dir(env, name: str) -> Path | None:
    """``$XDG_CACHE_HOME/fsdp2-harness/<name>`` (made), or None where it cannot be made."""
    root = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fsdp2-harness" / name
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return root


def worker_env(env: dict) -> dict:
    """The variables a rank's environment gets (none the user set is replaced)."""
    out = {}
    if not env.get("TORCHINDUCTOR_CACHE_DIR"):
        root = cache_dir(env, "inductor")  # None: Inductor's default (the launch's TMPDIR)
        if root is not None:
            out["TORCHINDUCTOR_CACHE_DIR"] = str(root)
    if not env.get("TORCHINDUCTOR_COMPILE_THREADS"):
        out["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    return out
