"""torch.compile's own start-up in a rank's idle seconds (the ``compile_warmup`` layer).

TE compiles its fused functions with ``torch.compile`` at their first call: a rank's first case
then imports Dynamo's tracer, AOT autograd and Inductor (its custom prims registered at import,
its kernel templates compiled by Jinja) and hashes torch's sources for the compile caches' keys.
A thread of the rank does that while the rank waits for its CUDA context (the run's larger
worlds first: ``context_gate``) and its process groups; the rank joins it before its first
task, so no case runs beside it. What the rank compiles, and so what the cases check, is
unchanged.
"""

from __future__ import annotations

import importlib
import threading

MODULES = ("torch._functorch.aot_autograd", "torch._inductor.compile_fx",
           "torch._inductor.inductor_prims", "torch._inductor.lowering",
           "torch._inductor.decomposition", "torch._inductor.scheduler",
           "torch._inductor.codegen.wrapper", "torch._inductor.codegen.triton",
           "torch._inductor.runtime.triton_heuristics", "torch._inductor.kernel",
           "torch._inductor.fx_passes.joint_graph", "torch._inductor.fx_passes.post_grad")
JOIN_S = 60.0  # the longest a rank waits for it before its first task


def _load() -> None:
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - another torch: the first compile imports it
            pass
    try:
        importlib.import_module("torch._inductor.codecache").torch_key()
    except Exception:  # noqa: BLE001 - as above
        pass


def start(backend: str) -> threading.Thread | None:
    """The warm-up thread, started, where ``backend`` compiles at its first use (TE)."""
    if backend != "te":
        return None
    t = threading.Thread(target=_load, daemon=True, name="compile-warmup")
    t.start()
    return t


def finish(thread: threading.Thread | None) -> None:
    """Before the rank's first task: the warm-up done (bounded)."""
    if thread is not None:
        thread.join(JOIN_S)
