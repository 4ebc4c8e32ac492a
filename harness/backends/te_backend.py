"""TransformerEngine backend: real TE modules, recipes and FusedAdam on CUDA.

The same scenario files run here as on the plain-torch and reference backends. What TE can do
is detected, never assumed from a version number:

* recipes: TE's own availability checks (``te.is_fp8_available(return_reason=True)``, ...);
  a recipe the GPU cannot run is a skip carrying TE's reason;
* FSDP2 x TP: needs ``set_device_mesh`` on TE modules (TE PR #2713): TE's own where the
  installed TE has it, else the bundled port (backends/te_tp; :func:`te_tp.tp_support` says
  which: ``versions()["te_tp"]`` and a note on every TP case);
* workarounds of TE bugs are findings (``WORKAROUNDS``: registry entries, reported on every
  case, and the ``te_workarounds`` scenario runs without each one -- axis ``without`` -- so the
  failure stays measured): TE's ``reset_parameters`` looks the HSDP shard group up as
  ``mesh["shard"]`` (the mesh dims are named ``replicate`` / ``shard`` / ``tp``); the initial
  full state dict keeps TE's ``_extra_state`` entries (without them torch's
  ``set_model_state_dict`` hands TE a placeholder its ``set_extra_state`` rejects).

Modules: TE's own (``make``), LlamaStack of TE layers (``te_llama_stack.py``: a
``torch.nn.Embedding`` with a tied ``te.Linear`` head, kept high precision), or the factory a
scenario names (harness/spec/models.py; it may build TE layers, ``ctx.backend == "te"``).

Models follow TE's FSDP2 recipe: build on ``device="meta"`` under ``te.quantized_model_init``,
``fully_shard`` each child then the root, ``reset_parameters()``; then, the DelayedScaling amax
histories zeroed (``te_fresh_amax.py``), the weights of an FP32 TE module of the same seed are
loaded (``set_model_state_dict``, full state dict) so the FP32 single-process reference -- the
same TE module class, unquantized -- starts from the same values.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from harness.backends import te_fresh_amax, te_global_state, te_init_scales
from harness.backends.te_tp import BUNDLED
from harness.backends.te_tp import tp_support as _tp_support
from harness.backends.torch_backend import TorchBackend
from harness.calibration.twin import BLOCK_FORMATS
from harness.distributed import faults
from harness.spec import catalog

RECIPE_CLASS = {"delayed": "DelayedScaling", "current": "Float8CurrentScaling",
                "block": "Float8BlockScaling", "mxfp8": "MXFP8BlockScaling",
                "nvfp4": "NVFP4BlockScaling"}
AVAILABLE = {"delayed": "is_fp8_available", "current": "is_fp8_available",
             "block": "is_fp8_block_scaling_available", "mxfp8": "is_mxfp8_available",
             "nvfp4": "is_nvfp4_available"}
MESH_NAMES = {"dp_replicate": "replicate", "dp_shard": "shard", "tp": "tp"}
WORKAROUNDS = {  # keys: catalog.TE_WORKAROUNDS
    "hsdp_mesh_dim_names": "mesh dims named replicate / shard / tp: TE's reset_parameters "
                           "looks the HSDP shard group up as mesh['shard']",
    "init_extra_state": "the initial full state dict keeps TE's _extra_state entries: without "
                        "them torch's set_model_state_dict hands TE's set_extra_state a "
                        "placeholder it rejects ('Unsupported checkpoint format.')",
    te_init_scales.NAME: te_init_scales.WHY,
}


@functools.lru_cache(maxsize=1)
def _import():
    try:
        import transformer_engine
        import transformer_engine.pytorch as te
        return te, transformer_engine.__version__, None
    except Exception as e:  # noqa: BLE001 - any import failure is a skip reason
        return None, None, f"{type(e).__name__}: {e}"


# FSDP2 cannot all-gather block-scaled tensors over a one-rank shard dim (the registered
# hsdp*x1 failure); with no mixed-precision policy for a quantized recipe FSDP2 would neither
# cast nor reduce there, so the twin's plain module computes what it would
TWIN_WITHOUT_FSDP = BLOCK_FORMATS


# Float8Tensor's transpose cache and the columnwise copies of blockwise / MXFP8 / NVFP4 tensors
# are (re)built when a GEMM needs them; whatever a load leaves absent is compared after the next
# step with the uninterrupted run's (dcp_roundtrip rebuilt_buffers).
LAZY_BUFFERS = ("transpose", "columnwise")


class TEBackend(TorchBackend):
    name = "te"
    recipes = catalog.RECIPES_BY_BACKEND["te"]
    amax_group_twin = ("delayed",)  # amaxes reduced over the world each step (single.py)
    twin_without_fsdp = TWIN_WITHOUT_FSDP
    lazy_buffers = LAZY_BUFFERS
    global_state = staticmethod(te_global_state.roots)  # TE's FP8 state manager
    # --- pytest process -------------------------------------------------------------------
    def skip_reason(self, case, device: str) -> str | None:
        if device != "cuda":
            return "the te backend needs CUDA (--device cuda)"
        te, version, err = _import()
        if te is None:
            return f"TransformerEngine is not importable: {err}"
        if case.recipe in AVAILABLE:
            ok, reason = getattr(te, AVAILABLE[case.recipe])(return_reason=True)
            if not ok:
                return f"{RECIPE_CLASS[case.recipe]} not available on this GPU (TE: {reason})"
        return self.layout_skip_reason(case)

    @staticmethod
    def layout_skip_reason(case) -> str | None:
        """TE's layout requirements on the case's weights and meshes (layout.py; no CUDA or TE
        import). A factory's model is its own (its layers are unknown here)."""
        from harness.backends import layout
        r = case.recipe
        return None if case.model_ref is not None else layout.skip_reason(
            case, layout.te_weights(case.ax["module"], case.model), layout.TE_BLOCKS.get(r),
            layout.gathers_quantized(case, "mutation"), layout.TE_GEMM_ALIGN.get(r))

    def preload(self) -> None:
        _import()

    def versions(self) -> dict[str, str]:
        te, version, _ = _import()
        return {"te": version, "te_tp": _tp_support(te)} if version else {}

    def case_notes(self, case) -> dict[str, str]:
        te = _import()[0]
        if _tp(case) == 1 or te is None:
            return {}
        return {"te_tp": f"TE modules hand FSDP2 / DCP their TP shards through PR #2713's "
                         f"set_device_mesh: {_tp_support(te)}"}

    # --- worker ---------------------------------------------------------------------------
    def recipe(self, case):
        if case.recipe not in RECIPE_CLASS:
            return None
        from transformer_engine.common import recipe as te_recipe
        return getattr(te_recipe, RECIPE_CLASS[case.recipe])()

    def quantized(self, case) -> bool:
        return case.recipe in RECIPE_CLASS

    def make(self, case, device: str, mesh=None, mesh_spec=None, seed: int | None = None):
        """The case's TE module on ``device`` (te_modules.py)."""
        from harness.backends.te_modules import make
        return make(_import()[0], case, self.name, device, mesh, mesh_spec, seed)

    def reference_model(self, case, seed: int, device):
        """The FP32 reference: the same TE module, unquantized, on one GPU."""
        with torch.random.fork_rng(devices=[device.index] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            return self.make(case, str(device), seed=seed)

    def build(self, case, mesh, mesh_spec, seed: int, device, fsdp: bool = True):
        from harness.distributed import parallel
        te, _, _ = _import()
        with te.quantized_model_init(enabled=self.quantized(case), recipe=self.recipe(case)):
            model = self.make(case, "meta", mesh, mesh_spec, seed)
        ties = parallel.tied_groups(model)
        if case.model_ref is not None and mesh_spec.tp > 1:  # the factory's plain layers
            from harness.spec import models
            from harness.spec.mesh import TP
            ctx = models.context(case, self.name, seed, "meta", mesh, mesh_spec)
            parallel.apply_tp(model, mesh[TP], models.tp_plan(case.model_ref, model, ctx))
            parallel.retie(model, ties)
        if fsdp:
            parallel.shard(model, mesh, mesh_spec, case.recipe, units=_fsdp_units(model, case),
                           names=self.mesh_names(case),
                           reduce_dtype=faults.reduce_dtype(case, mesh_spec))
        for m in model.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
        materialize(model, device)
        parallel.retie(model, ties)  # TE's reset_parameters may re-register a tied alias
        te_fresh_amax.reset(model)  # not the amax of TE's random init (te_fresh_amax.py)
        full = self.reference_model(case, seed, device).state_dict()
        if mesh_spec.tp > 1:  # plain TP shards (port piece dtensor_params off) take their slice
            full = _tp_local_full(model, full, mesh, mesh_spec)
        _load_initial(model, full, self.applied_workarounds(case), self.mesh_names(case))
        return model

    def optimizer(self, model, case):
        """FusedAdam; fp32 master weights for quantized params unless the case's ``optimizer``
        axis says ``no_master_weights``."""
        from transformer_engine.pytorch.optimizers import FusedAdam
        master = self.quantized(case) and case.ax.get("optimizer") != "no_master_weights"
        return FusedAdam(model.parameters(), lr=self.lr(case), master_weights=master,
                         master_weight_dtype=torch.float32)

    def canonical_state(self, flat: dict) -> dict:
        """TE's ``_extra_state`` entries by what they hold (:func:`extra_state_contents`)."""
        from harness.backends.te_extra_state import extra_state_contents
        return extra_state_contents(flat)

    def applied_workarounds(self, case) -> dict[str, str]:
        without = case.ax.get("without", "none")
        return {k: v for k, v in WORKAROUNDS.items() if k != without}

    def mesh_names(self, case) -> dict | None:
        return MESH_NAMES if "hsdp_mesh_dim_names" in self.applied_workarounds(case) else None

    @contextlib.contextmanager
    def case_context(self, case):
        """A fresh TE global FP8 state for each case, as a process of its own would have (a
        long-lived launch runs many; TE registers every DelayedScaling module's amax history
        in process-global buffers keyed by autocast, so a case must not depend on which
        cases ran before it), and the case's TE mutant (axis ``mutation``) patched in for the
        case's duration; on FSDP2 x TP cases without TE's own set_device_mesh, the port's class
        patches (backends/te_tp/port.py) around it."""
        from harness.backends import te_mutations
        _reset_global_state()
        try:
            with _port_patches(case):
                with te_mutations.applied(case.ax.get("mutation", "none")):
                    yield
        finally:
            _reset_global_state()

    def isolated(self):
        """TE's global FP8 state of its own while rank 0 runs alone (te_global_state.py)."""
        return te_global_state.isolated()

    def one_update_per_step(self, case):  # DelayedScaling's twin: once a step
        held = self.twin_amax_group(case)
        return te_global_state.OneUpdatePerStep() if held else super().one_update_per_step(case)

    def autocast(self, case, group=None):
        te, _, _ = _import()
        if not self.quantized(case):
            return contextlib.nullcontext()
        return te.autocast(enabled=True, recipe=self.recipe(case),
                           **({} if group is None else {"amax_reduction_group": group}))

    def checks(self, case) -> dict:
        from harness.checks import te_checks
        return {**super().checks(case), **te_checks.CHECKS}


def _fsdp_units(model, case) -> list:
    """The modules fully_shard wraps before the root: a model's own choice, else a
    TransformerLayer's children."""
    if hasattr(model, "fsdp_units"):
        return model.fsdp_units()
    return list(model.children()) if case.ax["module"] == "TransformerLayer" else []


def _tp(case) -> int:
    """The case's TP size (its mesh's or its reshard target's)."""
    return max(case.mesh.tp, case.target.tp if case.target else 1)


def _port_patches(case):
    """The #2713 port's class patches on TE's tensors for an FSDP2 x TP case without TE's own
    ``set_device_mesh`` (backends/te_tp/port.py); nothing otherwise."""
    from harness.backends.te_tp.port import class_patches
    port = _tp(case) > 1 and _tp_support(_import()[0]) == BUNDLED
    return class_patches() if port else contextlib.nullcontext()


def _load_initial(model, full: dict, applied: dict, names: dict | None) -> None:
    """The reference's weights into the built model, with the workarounds ``applied`` (TE's
    ``_extra_state`` entries kept; current-scaling shards given their amax group first)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    if "init_extra_state" not in applied:
        full = {k: v for k, v in full.items() if not k.endswith("_extra_state")}
    if te_init_scales.NAME in applied:
        te_init_scales.apply(model, names)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True))


def _tp_local_full(model, full: dict, mesh, mesh_spec) -> dict:
    """``full`` cut to this TP rank's shards for parameters that are plain TP shards."""
    from harness.backends.te_tp.dtensor_params import tp_local_full
    from harness.spec.mesh import TP
    return tp_local_full(model, full, mesh[TP].get_local_rank(), mesh_spec.tp)


def _reset_global_state() -> None:
    te_global_state.manager().reset()


def materialize(model, device) -> None:
    """Give the tensors no ``reset_parameters`` moved off ``meta`` real storage (and their
    module's own initialisation): TE's modules materialize themselves, plain PyTorch ones
    (``nn.Embedding``, a factory's layers) stay on ``meta``. Anything still there when the
    reference's weights are loaded makes ``set_model_state_dict`` *assign* every tensor --
    TE's quantized parameters replaced by plain ones, tied weights untied."""
    for m in model.modules():
        own = [*m.parameters(recurse=False), *m.buffers(recurse=False)]
        if any(t.is_meta for t in own):
            m.to_empty(device=device, recurse=False)
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"still on device meta after initialisation: {', '.join(left[:5])}")


BACKEND = TEBackend()
