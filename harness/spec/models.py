"""Bring your own model: a module axis value that names a factory.

A scenario names its models under ``models`` and the module axis names them (ids stay
readable: ``my_scenario[fp32-dp2xtp2-my_model-sync-to_dp4]``)::

    models:
      my_model:
        factory: mypkg.model:build     # build(ctx: ModelContext) -> torch.nn.Module
        tp_plan: mypkg.model:plan      # plan(model, ctx) -> {fqn: ParallelStyle}; TP meshes
        task: next_token               # regression (default) | projection | next_token
    axes:
      module: [my_model, LlamaStack]

An installed package adds names through the entry-point group ``harness.modules``; the entry
point's object is the same mapping (values: import paths or the functions themselves)::

    [project.entry-points."harness.modules"]
    my_model = "mypkg.model:HARNESS_MODEL"   # {"factory": build, "tp_plan": plan, ...}

A scenario's own ``models`` entry shadows an installed name.

How a case uses it (every backend, every check unchanged):

* the factory is called on every rank under the case's seed (same init everywhere) and
  returns the whole, unsharded module; with a TP mesh the harness applies
  ``parallelize_module(model, ctx.tp_mesh, plan(model, ctx))``, then ``fully_shard`` on each of
  ``model.fsdp_units()`` (when the model defines it) and on the root (HSDP on a replicate dim);
* parameters registered under several names (tied weights) stay one parameter through TP (the
  harness re-ties what ``parallelize_module`` distributed separately); the ``tied_weights``
  check proves they stay tied after a load and a reshard;
* the single-process FP32 reference of fp32_parity is the same factory with ``ctx.mesh=None``
  and ``ctx.recipe="fp32"``;
* inputs, targets and loss are the ``task``'s (``catalog.TASKS``, ``distributed/data.py``);
* te backend: the factory runs on device ``meta`` under ``te.quantized_model_init`` and may
  build TE layers (``ctx.backend == "te"``); TP of TE layers needs PR #2713's
  ``set_device_mesh`` (TE's own or ``backends.te_tp.port.set_device_mesh``). The reference
  backend quantizes only its own TE-style modules: a factory's plain layers run fp32 / bf16
  there, and quantized recipes skip with that reason.

At load time (pytest collection) each model the selected cases use is imported, built as the
reference and run once on its task's batch (where the backend can run here): a factory that
cannot be imported, raises, or returns something unusable is a one-line usage error naming
the scenario file and the factory, not a failure deep in a worker.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from harness.spec import catalog

ORIGIN_SCENARIO = "models"


class ModelError(ValueError):
    """A model reference that cannot be used (one line: what is wrong with which factory)."""


@dataclass(frozen=True)
class ModelRef:
    """A module axis value that names a factory, as the case carries it to the workers."""
    name: str
    factory: str  # "package.module:attr"
    tp_plan: str | None = None
    task: str = "regression"
    origin: str = field(default="", compare=False)  # "models.<name>" or "entry point ..."

    def to_json(self) -> dict:
        return dict(name=self.name, factory=self.factory, tp_plan=self.tp_plan, task=self.task,
                    origin=self.origin)

    @classmethod
    def from_json(cls, d: dict | None) -> "ModelRef | None":
        return cls(**d) if d else None


@dataclass(frozen=True)
class ModelContext:
    """What a factory (and a TP plan) receives.

    dims       the case's ``model`` dims (hidden, ffn, heads, seq, batch, out_features,
               layers, vocab): build for these, whole (unsharded)
    dtype      parameter dtype: always torch.float32 (bf16 runs through FSDP2's
               MixedPrecisionPolicy, quantized recipes through the backend)
    device     where to build: "cpu" / a CUDA device, or "meta" (te backend: the harness then
               calls ``reset_parameters`` and loads the reference's weights)
    recipe     the case's recipe (fp32, bf16, delayed, ...); "fp32" for the reference
    backend    "torch" | "reference" | "te"
    seed       the seed the harness set before calling the factory
    mesh       the case's DeviceMesh (dims dp_replicate / dp_shard / tp), None for the
               single-process reference and the load-time probe
    mesh_spec  the harness's MeshSpec of ``mesh`` (``.tp``, ``.dp_size``, ...), or None
    """
    dims: Any
    dtype: Any
    device: Any
    recipe: str
    backend: str
    seed: int
    mesh: Any = None
    mesh_spec: Any = None

    @property
    def reference(self) -> bool:
        return self.mesh is None

    @property
    def tp(self) -> int:
        return self.mesh_spec.tp if self.mesh_spec is not None else 1

    @property
    def tp_mesh(self):
        """The 1-D TP sub-mesh (``parallelize_module``'s mesh), or None without TP."""
        if self.mesh is None or self.tp == 1:
            return None
        from harness.spec.mesh import TP
        names = self.mesh.mesh_dim_names or ()
        return self.mesh[TP] if TP in names else self.mesh["tp"]


# --- where references come from -------------------------------------------------------------
def installed() -> dict[str, Any]:
    """Installed entry points of group ``harness.modules`` by name (not loaded)."""
    from importlib.metadata import entry_points
    return {ep.name: ep for ep in entry_points(group=catalog.MODULE_ENTRY_POINTS)}


def from_entry_point(name: str) -> ModelRef:
    ep = installed().get(name)
    origin = f"entry point {catalog.MODULE_ENTRY_POINTS}:{name}"
    if ep is None:
        raise ModelError(f"unknown module '{name}': neither built in, in the scenario's "
                         f"'models', nor an installed {catalog.MODULE_ENTRY_POINTS} entry point")
    try:
        obj = ep.load()
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to see
        raise ModelError(f"{origin} ({ep.value}) cannot be loaded: {_one_line(e)}") from None
    if not isinstance(obj, dict) or "factory" not in obj:
        raise ModelError(f"{origin} ({ep.value}) must be a mapping with 'factory' (and "
                         f"optional 'tp_plan', 'task'), got {type(obj).__name__}")
    task = obj.get("task", "regression")
    if task not in catalog.TASKS:
        raise ModelError(f"{origin}: unknown task {task!r}; allowed: {', '.join(catalog.TASKS)}")
    return ModelRef(name, _import_path(obj["factory"]),
                    _import_path(obj["tp_plan"]) if obj.get("tp_plan") else None, task, origin)


def _import_path(v) -> str:
    """An import path, or the function's own ("module:qualname"): workers re-import it."""
    return v if isinstance(v, str) else f"{v.__module__}:{v.__qualname__}"


def load_object(path: str, what: str = "factory"):
    """Import ``package.module:attr`` (attr may be dotted)."""
    mod_name, _, attr = path.partition(":")
    try:
        obj = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as e:  # noqa: BLE001 - ImportError, AttributeError, errors at import
        raise ModelError(f"{what} {path} cannot be imported: {_one_line(e)}") from None
    if not callable(obj):
        raise ModelError(f"{what} {path} is a {type(obj).__name__}, not a function")
    return obj


def locate(path: str, what: str = "factory") -> None:
    """Without running the module: can ``package.module`` of ``path`` be found? (For models
    no case of this run can build, e.g. te factories on a CPU machine.)"""
    from importlib.util import find_spec
    mod_name = path.partition(":")[0]
    try:
        found = find_spec(mod_name) is not None
    except Exception as e:  # noqa: BLE001 - a parent package that fails to import
        raise ModelError(f"{what} {path} cannot be imported: {_one_line(e)}") from None
    if not found:
        raise ModelError(f"{what} {path} cannot be imported: no module named '{mod_name}'")


# --- building ---------------------------------------------------------------------------------
def context(case, backend: str, seed: int, device, mesh=None, mesh_spec=None,
            reference: bool = False) -> ModelContext:
    import torch
    return ModelContext(dims=case.model, dtype=torch.float32, device=device,
                        recipe="fp32" if reference else case.recipe, backend=backend, seed=seed,
                        mesh=None if reference else mesh,
                        mesh_spec=None if reference else mesh_spec)


def build(ref: ModelRef, ctx: ModelContext):
    """Call the factory under ``ctx.seed`` (the caller's RNG state is restored) and check what
    it returned: an ``nn.Module`` with parameters."""
    import torch
    from torch import nn
    factory = load_object(ref.factory)
    dev = torch.device(ctx.device)
    with torch.random.fork_rng(devices=[dev.index or 0] if dev.type == "cuda" else []):
        torch.manual_seed(ctx.seed)
        try:
            model = factory(ctx)
        except Exception as e:  # noqa: BLE001 - the user's factory: report, do not crash
            raise ModelError(f"factory {ref.factory} raised {_one_line(e)}") from None
    if not isinstance(model, nn.Module):
        raise ModelError(f"factory {ref.factory} returned {type(model).__name__}, not a "
                         f"torch.nn.Module")
    if not any(True for _ in model.parameters()):
        raise ModelError(f"factory {ref.factory} returned a {type(model).__name__} without "
                         f"parameters: nothing to shard, train or checkpoint")
    return model


def tp_plan(ref: ModelRef, model, ctx: ModelContext) -> dict:
    """The model's ``parallelize_module`` plan, checked: {submodule fqn: ParallelStyle}."""
    from torch.distributed.tensor.parallel import ParallelStyle
    if ref.tp_plan is None:
        raise ModelError(f"model '{ref.name}' has no tp_plan: a TP mesh needs one")
    fn = load_object(ref.tp_plan, "tp_plan")
    try:
        plan = fn(model, ctx)
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"tp_plan {ref.tp_plan} raised {_one_line(e)}") from None
    if not isinstance(plan, dict) or not plan:
        raise ModelError(f"tp_plan {ref.tp_plan} returned {type(plan).__name__}, not a "
                         f"non-empty dict {{submodule fqn: ParallelStyle}}")
    for fqn, style in plan.items():
        if not isinstance(style, ParallelStyle):
            raise ModelError(f"tp_plan {ref.tp_plan}: '{fqn}' maps to "
                             f"{type(style).__name__}, not a ParallelStyle")
        if "*" not in fqn:
            try:
                model.get_submodule(fqn)
            except AttributeError:
                raise ModelError(f"tp_plan {ref.tp_plan}: '{fqn}' names no submodule of "
                                 f"{type(model).__name__}") from None
    return plan


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
