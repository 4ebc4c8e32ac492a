"""What a check is: a name, the artifacts it needs, and a function that turns them into rows.

Artifacts are what the worker's producers (``worker/producers.py``) make on every rank:

    trained       the model + optimizer after ``train.steps`` steps (``Trained``)
    reference     the single-process FP32 run of the same module (``Reference``)
    checkpoint    the DCP checkpoint of the trained state and that state *S* (``Saved``)
    continued     the uninterrupted run's next step after the save (``Continued``)
    loaded        a fresh model + optimizer loaded from the checkpoint, same mesh (``Run``)
    expected      reshard phase: *S* and the uninterrupted next step, from the train phase
    resharded     reshard phase: a fresh model + optimizer on the target mesh, loaded (``Run``)

The runner (``worker/runner.py``) runs each check once everything it needs exists; a check
whose artifact could not be made is recorded as not run, with the reason. Adding a check is
one module in ``checks/`` that defines a ``Check`` and one line in ``checks/__init__.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Check:
    name: str
    needs: tuple[str, ...]
    fn: Callable[["Artifacts", Any], None]  # fn(artifacts, recorder): records rows
    phase: str = "train"  # the task whose world runs it: "train" (case mesh) or "reshard"


@dataclass
class Artifacts:
    """What the producers made so far on this rank, and why anything is missing."""
    ctx: Any
    case: Any
    ckpt: Any  # the case's checkpoint directory (pathlib.Path)
    have: dict[str, Any] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # artifact -> why it is missing
    via: dict[str, str] = field(default_factory=dict)  # artifact -> workaround that made it
    rec: Any = None  # the case's Recorder (producers record traces, e.g. the loss per step)
    load_fn: Callable | None = None  # how producers load a checkpoint: fn(run, path)
    for_reshard: bool = False  # a reshard phase loads the train phase's checkpoint

    def __getitem__(self, name: str) -> Any:
        return self.have[name]

    def __contains__(self, name: str) -> bool:
        return name in self.have


def on_trained(name: str, fn: Callable) -> Check:
    """A check of the trained model alone: ``fn(run, recorder)``."""
    return Check(name, ("trained",), lambda art, rec: fn(art["trained"].run, rec))
