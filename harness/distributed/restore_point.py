"""A run's state taken in place and put back in place: what lets one trained run serve a second
DCP mode (worker/mode_group.py) without a load, which would be a path the case does not test.

:func:`take` walks everything a step can change, from the model, the optimizer and the
backend's process-global state (``backend.global_state()``): each container's and object's
bindings (so a buffer built, dropped or replaced later is put back as it was) and a copy of
every plain tensor's values. A DTensor is walked to its local tensor and a quantized tensor
to its raw buffers; process groups, meshes and FSDP's own state are not walked (they hold no
values a step changes). :meth:`RestorePoint.restore` writes the copies back into the same
tensors and re-binds what was re-bound. Nothing here proves the result equal to the trained
state: the mode group compares the state each save captures and the uninterrupted next step
with the first mode's, bit for bit, and trains a run of the mode's own where they differ.
"""

from __future__ import annotations

import enum

import torch
from torch.distributed.tensor import DTensor

# objects of these packages are walked (their attributes); other objects are left alone
WALKED = ("transformer_engine", "harness.reference", "harness.backends", "harness.distributed")
LEFT_OUT = ("harness.distributed.gather",)


class RestorePoint:
    def __init__(self):
        self.tensors: list[tuple[torch.Tensor, torch.Tensor]] = []  # (live, copy)
        self.dicts: list[tuple[dict, dict]] = []  # containers and objects' __dict__
        self.lists: list[tuple[list, list]] = []
        self.attrs: list[tuple[object, dict]] = []  # classes, slots, extension types
        self.rng: tuple = (None, None)
        self._seen: set[int] = set()

    def restore(self) -> None:
        """Bindings first (they bring back the live tensors), then the tensors' values."""
        for d, items in self.dicts:
            d.clear()
            d.update(items)
        for lst, items in self.lists:
            lst[:] = items
        for obj, attrs in self.attrs:
            for k, v in attrs.items():
                try:
                    setattr(obj, k, v)
                except (AttributeError, TypeError):  # read-only: its tensors are restored
                    pass
        with torch.no_grad():
            for live, copy in self.tensors:
                live.copy_(copy)
        cpu, cuda = self.rng
        if cpu is not None:
            torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda)

    # -- the walk ----------------------------------------------------------------------------
    def walk(self, v) -> None:
        if v is None or isinstance(v, (bool, int, float, str, bytes, type, enum.Enum)) \
                or id(v) in self._seen:
            return
        self._seen.add(id(v))
        if isinstance(v, DTensor):
            self.attrs.append((v, {"_local_tensor": v._local_tensor}))
            self.walk(v._local_tensor)
        elif isinstance(v, torch.Tensor):
            if type(v) in (torch.Tensor, torch.nn.Parameter) and v.device.type != "meta":
                self.tensors.append((v, v.detach().clone()))
            # a quantized tensor's raw buffers are its attributes; a plain one may have some
            self._object(v)
        elif isinstance(v, dict):
            self._dict(v)
        elif isinstance(v, list):
            self.lists.append((v, list(v)))
            for x in list(v):
                self.walk(x)
        elif isinstance(v, (tuple, set, frozenset)):
            for x in v:
                self.walk(x)
        elif isinstance(v, (torch.nn.Module, torch.optim.Optimizer)) or _walked(v):
            self._object(v)

    def _dict(self, d: dict) -> None:
        self.dicts.append((d, dict(d)))
        for k, x in list(d.items()):
            self.walk(k)
            self.walk(x)

    def _object(self, obj) -> None:
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict):
            self._dict(d)
            return
        attrs = _attributes(obj)  # a class (process-global state) or an extension type
        self.attrs.append((obj, attrs))
        for x in attrs.values():
            self.walk(x)

    def root(self, cls) -> None:
        """A class whose attributes are process-global state (e.g. TE's FP8 state manager)."""
        self._object(cls)


def _walked(v) -> bool:
    mod = getattr(type(v), "__module__", "") or ""
    return mod.startswith(WALKED) and not mod.startswith(LEFT_OUT)


def _attributes(obj) -> dict:
    """The public attribute bindings of an object without a ``__dict__`` of its own (a class,
    a pybind type) that hold state: tensors, containers, walked objects."""
    out = {}
    for k in (vars(obj).keys() if isinstance(obj, type) else dir(obj)):
        if k.startswith("__"):
            continue
        try:
            v = getattr(obj, k)
        except Exception:
            continue
        if isinstance(v, (torch.Tensor, dict, list)) or _walked(v):
            out[k] = v
    return out


def take(run) -> RestorePoint:
    """The run's state now (model, optimizer, the backend's global state, the RNGs)."""
    p = RestorePoint()
    p.walk(run.model)
    p.walk(run.optim)
    for cls in run.backend.global_state():
        p.root(cls)
    p.rng = (torch.get_rng_state(),
             torch.cuda.get_rng_state() if torch.cuda.is_available() and
             torch.cuda.is_initialized() else None)
    return p
