"""torch.compile's own modules imported once, in the rank server, for every rank it forks.

TE compiles its fused functions with ``torch.compile`` at their first call
(``transformer_engine.pytorch.jit.lazy_compile``): a rank's first case then imports Dynamo's
tracer, AOT autograd and Inductor's lowering, scheduler and Triton code generation -- some 300
modules TE's own import leaves out -- in every rank of every launch. Imported in the rank server
(``launch/fork_agent.preload``) before it forks, the forked ranks have them. Importing a module
runs no compile and makes no CUDA context (the server checks that after its imports); what a
rank compiles, and so what the cases check, is unchanged.

:data:`MODULES` are the roots whose imports pull in the rest (torch 2.11 and 2.13); a root a
torch version lacks is left out, as is the whole list where the library under test compiles
nothing (:func:`wanted`).
"""

from __future__ import annotations

import importlib

MODULES = ("torch._functorch.aot_autograd", "torch._inductor.compile_fx",
           "torch._inductor.lowering", "torch._inductor.decomposition",
           "torch._inductor.scheduler", "torch._inductor.codegen.wrapper",
           "torch._inductor.codegen.triton", "torch._inductor.runtime.triton_heuristics",
           "torch._inductor.fx_passes.joint_graph", "torch._inductor.fx_passes.post_grad")


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


def load(modules=MODULES) -> list[str]:
    """Import ``modules``; the names that could not be imported (an older or newer torch)."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing
