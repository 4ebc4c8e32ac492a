"""Plain-torch backend: the harness's own modules, TP via parallelize_module, FSDP2 with a
MixedPrecisionPolicy for bf16."""

from __future__ import annotations

import contextlib

import torch

from .. import catalog


class TorchBackend:
    name = "torch"
    recipes = catalog.RECIPES_BY_BACKEND["torch"]

    # --- pytest process -------------------------------------------------------------------
    def skip_reason(self, case, device: str) -> str | None:
        """Why ``case`` cannot run here (a skip, never an xfail), or None."""
        return None

    def versions(self) -> dict[str, str]:
        return {}

    # --- worker ---------------------------------------------------------------------------
    def build(self, case, mesh, mesh_spec, seed: int, device):
        from ..worker import modules, parallel
        model = modules.build(case.ax["module"], case.model, seed, device)
        return parallel.parallelize(model, mesh, mesh_spec, case.recipe)

    def reference_model(self, case, seed: int, device):
        """The module the single-process FP32 reference trains (the plain-torch module)."""
        from ..worker import modules
        return modules.build(case.ax["module"], case.model, seed, device)

    def optimizer(self, model, case):
        return torch.optim.Adam(model.parameters(), lr=case.train.lr)

    def autocast(self, case):
        return contextlib.nullcontext()

    def canonical_names(self, model) -> dict:
        """Backend param name -> the plain-torch module's name (identity here)."""
        return {}

    def checks(self, case) -> dict:
        """Checks beyond the phases' own: name -> callable(run, recorder)."""
        from ..checks.export import safetensors_export
        from ..checks.quantized import optimizer_state_placement
        return {"optimizer_state_placement": optimizer_state_placement,
                "safetensors_export": safetensors_export}


BACKEND = TorchBackend()
