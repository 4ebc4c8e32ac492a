"""TE's ``_extra_state`` read by content (the te backend's canonical state)."""

from __future__ import annotations

import torch


def extra_state_contents(flat: dict) -> dict:
    """TE's ``_extra_state`` is a pickled dict (DelayedScaling's scales and amax histories,
    the recipe, bookkeeping values) in a uint8 tensor. Its bytes need not repeat between two
    ``state_dict()`` calls of one state, so the checks compare what it holds: each tensor as
    ``<key>#<name>``, each value of ``extra_fp8_variables`` as ``<key>#extra.<name>``, the
    recipe by its repr. It is TE's own pickle of this run, read as TE's set_extra_state
    reads it."""
    import pickle
    out = {}
    for k, v in flat.items():
        if not (k.endswith("_extra_state") and isinstance(v, torch.Tensor)
                and v.dtype == torch.uint8 and v.numel()):
            out[k] = v
            continue
        try:
            state = pickle.loads(v.numpy().tobytes())
        except Exception:  # noqa: BLE001 - not TE's format: compare the bytes
            out[k] = v
            continue
        for name, item in state.items():
            if name == "extra_fp8_variables":
                out.update({f"{k}#extra.{n}": _plain(x) for n, x in item.items()})
            elif isinstance(item, torch.Tensor):
                out[f"{k}#{name}"] = item
            else:
                out[f"{k}#{name}"] = repr(item)
    return out


def _plain(x):
    """A value weights_only loading accepts (the reshard phase reads S back): numbers and
    strings as they are, anything else (enums, tuples of them) by its repr."""
    return x if isinstance(x, (bool, int, float, str)) else repr(x)
