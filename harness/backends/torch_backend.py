"""Plain-torch backend: the harness's own modules (or the factory a scenario names,
harness/spec/models.py), TP via parallelize_module, FSDP2 with a MixedPrecisionPolicy for bf16."""

from __future__ import annotations

import contextlib

import torch

from harness.distributed import faults
from harness.spec import catalog


class TorchBackend:
    name = "torch"
    amax_group_twin: tuple[str, ...] = ()  # recipes whose twin reduces amaxes over its ranks
    twin_without_fsdp: tuple[str, ...] = ()  # recipes whose twin is built without fully_shard
    recipes = catalog.RECIPES_BY_BACKEND["torch"]
    # name fragments of quantized-tensor buffers the backend rebuilds lazily (on the next
    # forward / backward): a load may leave them absent; dcp_roundtrip then compares them
    # after the next step. Nothing is lazy unless a backend says so.
    lazy_buffers: tuple[str, ...] = ()

    # --- pytest process -------------------------------------------------------------------
    def skip_reason(self, case, device: str) -> str | None:
        """Why ``case`` cannot run here (a skip, never an xfail), or None."""
        return None

    def versions(self) -> dict[str, str]:
        return {}

    def preload(self) -> None:
        """Import what the worker's cases will need (timed apart from the cases)."""

    # --- worker ---------------------------------------------------------------------------
    def build(self, case, mesh, mesh_spec, seed: int, device):
        from harness.distributed import parallel
        model, ctx = self.plain_model(case, seed, device, mesh, mesh_spec)
        plan = None
        if ctx is not None and mesh_spec.tp > 1:
            from harness.spec import models
            plan = models.tp_plan(case.model_ref, model, ctx)
        return parallel.parallelize(model, mesh, mesh_spec, case.recipe, plan,
                                    reduce_dtype=faults.reduce_dtype(case, mesh_spec))

    def build_twin(self, case, mesh, mesh_spec, seed: int, device):
        """The sharding-invariance twin's model on its own mesh (distributed/single.py): the
        case's build; without fully_shard for the recipes ``twin_without_fsdp`` names."""
        if case.recipe in self.twin_without_fsdp:
            return self.build(case, mesh, mesh_spec, seed, device, fsdp=False)
        return self.build(case, mesh, mesh_spec, seed, device)

    def reference_model(self, case, seed: int, device):
        """The module the single-process FP32 reference trains (the plain-torch module)."""
        return self.plain_model(case, seed, device, reference=True)[0]

    def plain_model(self, case, seed: int, device, mesh=None, mesh_spec=None,
                    reference: bool = False):
        """The case's whole plain-torch module and the ModelContext its factory got: a built-in
        (``distributed/modules.py``, context None) or the factory the module axis names."""
        if case.model_ref is None:
            from harness.distributed import modules
            return modules.build(case.ax["module"], case.model, seed, device), None
        from harness.spec import models
        ctx = models.context(case, self.name, seed, device, mesh, mesh_spec, reference)
        return models.build(case.model_ref, ctx), ctx

    def lr(self, case) -> float:
        """The learning rate of the run under test (a sized-bug fault may scale it)."""
        return case.train.lr * faults.run_lr_scale(case)

    def optimizer(self, model, case):
        return torch.optim.Adam(model.parameters(), lr=self.lr(case))

    def mesh_names(self, case) -> dict | None:
        """Names for the mesh dims (dp_replicate / dp_shard / tp), None: the harness's own."""
        return None

    def applied_workarounds(self, case) -> dict[str, str]:
        """Workarounds of the library under test this backend applies to the case (name ->
        what it does); each is a finding with its registry entry, measured without it by a
        scenario of its own. The worker records them on every case."""
        return {}

    def case_notes(self, case) -> dict[str, str]:
        """What else the backend wants on the case's rows (name -> text; e.g. the te backend:
        TE's own set_device_mesh or the bundled port). The worker records them as notes."""
        return {}

    def canonical_state(self, flat: dict) -> dict:
        """A flattened state as the checks compare it (the te backend decodes TE's pickled
        ``_extra_state``); the identity here."""
        return flat

    def case_context(self, case):
        """Around everything a case does in a worker (e.g. the te backend's mutants)."""
        return contextlib.nullcontext()

    def autocast(self, case, group=None):
        """Around a forward; ``group``: the process group a recipe's amaxes are reduced over
        (None: the library's default)."""
        return contextlib.nullcontext()

    def twin_amax_group(self, case) -> bool:
        """The one-rank twin's autocast reduces the recipe's amaxes over the twin's ranks
        (their group): where the sharded run reduces them over the data-parallel group and
        the library's default group would be the world (distributed/single.py)."""
        return case.recipe in self.amax_group_twin

    def global_state(self) -> list:
        """Classes whose attributes are process-global state a step changes (restore_point)."""
        return []

    def isolated(self):
        """Around a run one rank makes alone inside a case (the FP32 reference, the one-rank
        twin: reference_cache.cached): the library's process-global state of its own, the
        case's back afterwards. Plain torch keeps none."""
        return contextlib.nullcontext()

    def one_update_per_step(self, case):
        """Around one step of the one-rank twin's micro-batches (distributed/single.py): a
        context with ``next_slice()`` that makes a recipe's per-step state (DelayedScaling's
        amax history) advance once per step, as in the sharded run; nothing to do here."""
        return _NoHistory()

    def canonical_names(self, model) -> dict:
        """Backend param name -> the plain-torch module's name (identity here)."""
        return {}

    def checks(self, case) -> dict:
        """Checks of the trained model beyond the core ones: name -> callable(run, recorder)."""
        from harness.checks.quantized import optimizer_state_placement
        return {"optimizer_state_placement": optimizer_state_placement}


BACKEND = TorchBackend()


class _NoHistory(contextlib.AbstractContextManager):
    def __exit__(self, *exc) -> None:
        return None

    def next_slice(self) -> None:
        pass
