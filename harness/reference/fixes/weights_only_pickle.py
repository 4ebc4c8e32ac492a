"""TE #2974: pickling that ``torch.load(weights_only=True)`` accepts (DCP loads that way).

The weights-only unpickler rejects every GLOBAL not registered with
``torch.serialization.add_safe_globals``. Before the fix ``__reduce_ex__`` referenced a bound
classmethod, which pickles as ``(getattr, (cls, name))`` -> "Unsupported global: GLOBAL
builtins.getattr". The fix: a module-level reconstructor and an allow-list of exactly the
reconstructor and the classes it needs.
"""

import torch

from harness.reference.fixes import _listeners, on

NAME = "weights_only_pickle"
_registered: list = []


def safe_globals(objs: list) -> None:
    """Objects to allow-list when the fix is on (called once by qtensor)."""
    _registered[:] = objs
    _sync()


def _sync() -> None:
    current = [g for g in torch.serialization.get_safe_globals() if g not in _registered]
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(current + (_registered if on(NAME) else []))


_listeners.append(_sync)


def fixed() -> bool:
    return on(NAME)
