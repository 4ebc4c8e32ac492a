"""torch.compile's own start-up done once, in the rank server, for every rank it forks.

TE compiles its fused functions with ``torch.compile`` at their first call
(``transformer_engine.pytorch.jit.lazy_compile``): a rank's first case then imports Dynamo's
tracer, AOT autograd and Inductor (its custom prims registered at import, its kernel templates
compiled by Jinja at import) and hashes torch's sources for the FX-graph and AOT-autograd cache
keys -- in every rank of every launch. Done in the rank server (``launch/fork_agent.preload``)
before it forks, the forked ranks have it. No import or key touches CUDA (the server checks
after its imports); what a rank compiles, and so what the cases check, is unchanged.

:data:`MODULES` are the roots whose imports pull in the rest; a root a torch version lacks is
left out, as is everything where the library under test compiles nothing (:func:`wanted`).
"""

from __future__ import annotations

import importlib

MODULES = ("torch._functorch.aot_autograd", "torch._inductor.compile_fx",
           "torch._inductor.inductor_prims", "torch._inductor.lowering",
           "torch._inductor.decomposition", "torch._inductor.scheduler",
           "torch._inductor.codegen.wrapper", "torch._inductor.codegen.triton",
           "torch._inductor.runtime.triton_heuristics", "torch._inductor.kernel",
           "torch._inductor.fx_passes.joint_graph", "torch._inductor.fx_passes.post_grad")
KEYS = (("torch._inductor.codecache", "torch_key"),)  # cached functions every rank would call


def wanted(backend: str) -> bool:
    """Whether ranks of ``backend`` compile at their first use: TE where its ``jit_fuser`` is
    torch.compile, lazily or not (``NVTE_TORCH_COMPILE`` unset or 1 on torch 2; older TE fused
    with TorchScript); no other backend compiles."""
    if backend != "te":
        return False
    try:
        jit = importlib.import_module("transformer_engine.pytorch.jit")
    except Exception:  # noqa: BLE001 - no TE: nothing of it compiles
        return False
    import torch
    fuser = getattr(jit, "jit_fuser", None)
    return fuser is not None and fuser in (getattr(jit, "lazy_compile", None), torch.compile)


def load(modules=MODULES, keys=KEYS) -> list[str]:
    """Import ``modules`` and compute ``keys``; the names that could not be (another torch)."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    for where, name in keys:
        try:
            getattr(importlib.import_module(where), name)()
        except (ImportError, AttributeError):
            missing.append(f"{where}.{name}")
    return missing
