"""Reference backend: our pure-PyTorch TE-style quantized tensors and modules (harness/reference),
on CPU (gloo) or GPU. Every TE fix the harness is built around is a switch here (axis ``fixes``).
A model a scenario brings (harness/spec/models.py) runs its own plain layers here, fp32 / bf16.
"""

from __future__ import annotations

import torch.distributed as dist

from harness.backends.torch_backend import TorchBackend
from harness.distributed import faults
from harness.spec import catalog
from harness.spec.mesh import TP as TP_DIM


class ReferenceBackend(TorchBackend):
    name = "reference"
    recipes = catalog.RECIPES_BY_BACKEND["reference"]

    def skip_reason(self, case, device: str) -> str | None:
        """A factory's model with a quantized recipe (its plain layers are not quantized
        here); blocked formats whose blocks the case's meshes would cut (QuantizedLayoutError
        at run time otherwise) and uneven shards of weights all-gathered quantized (a hang
        otherwise): a skip at collection, naming weight, mesh and rows (layout.py)."""
        if case.model_ref is not None:
            if case.recipe in catalog.QUANTIZED_RECIPES:
                return (f"model '{case.model_ref.name}' is built by a factory from plain torch "
                        f"layers; the reference backend quantizes only its own TE-style modules "
                        f"(a factory's model runs fp32 and bf16 here)")
            return None
        from harness.backends import layout
        return layout.skip_reason(case, layout.reference_weights(case.ax["module"], case.model),
                                  layout.reference_blocks(case.recipe),
                                  layout.gathers_quantized(case, "fixes"))

    def build(self, case, mesh, mesh_spec, seed: int, device):
        from harness.distributed import modules as canonical_modules
        from harness.distributed import parallel
        from harness.reference import build as ref
        from harness.reference import fixes
        fixes.configure(case.ax.get("fixes", "all"))
        if case.model_ref is not None:  # a factory's plain layers: TP by its plan
            return super().build(case, mesh, mesh_spec, seed, device)
        canonical = canonical_modules.build(case.ax["module"], case.model, seed).state_dict()
        tp = ref.TP()
        if mesh_spec.tp > 1:
            tp_mesh = mesh[TP_DIM]
            tp = ref.TP(mesh_spec.tp, tp_mesh.get_local_rank(), tp_mesh.get_group(), tp_mesh)
        # Delayed-scaling activation / gradient amaxes are reduced over all ranks of the mesh
        # (TE's default amax_reduction_group: the world): the histories are replicated buffers
        # and must agree. A mesh of fewer ranks (the twin) reduces over its own.
        world = dist.group.WORLD
        if mesh.size() != dist.get_world_size():
            world = parallel.mesh_group(mesh)
        env = ref.Env(case.recipe, tp, weight_group=parallel.weight_group(mesh, mesh_spec),
                      world_group=world)
        model = ref.build_meta(case.ax["module"], case.model, env)
        parallel.shard(model, mesh, mesh_spec, case.recipe,
                       reduce_dtype=faults.reduce_dtype(case, mesh_spec))
        return ref.materialize(model, canonical, device)

    def optimizer(self, model, case):
        from harness.reference.optim import MasterAdam
        return MasterAdam(model.parameters(), lr=self.lr(case))

    def autocast(self, case, group=None):
        from harness.reference.linear import autocast
        return autocast(True)

    def one_update_per_step(self, case):
        from harness.reference.quantizers import OneUpdatePerStep
        return OneUpdatePerStep()

    def canonical_names(self, model) -> dict:
        return model.canonical_names() if hasattr(model, "canonical_names") else {}

    def checks(self, case) -> dict:
        from harness.checks import quantized
        return {**super().checks(case), **quantized.CHECKS}


BACKEND = ReferenceBackend()
