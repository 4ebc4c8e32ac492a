"""Backends: how a case's model is built, parallelized, trained and checked.

    torch      plain PyTorch modules (fp32 / bf16), CPU or GPU
    reference  our pure-PyTorch TE-style quantized tensors and modules, CPU or GPU
    te         real TransformerEngine, GPU only

``get(name)`` imports lazily so the pytest process never imports TE unless asked.
"""

from __future__ import annotations

from importlib import import_module

_MODULES = {"torch": "torch_backend", "reference": "reference_backend", "te": "te_backend"}


def get(name: str):
    if name not in _MODULES:
        raise ValueError(f"unknown backend {name!r}; allowed: {', '.join(_MODULES)}")
    return import_module(f".{_MODULES[name]}", __name__).BACKEND
