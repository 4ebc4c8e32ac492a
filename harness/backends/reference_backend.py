"""Reference backend: our pure-PyTorch TE-style quantized tensors and modules (harness/reference),
on CPU (gloo) or GPU. Every TE fix the harness is built around is a switch here (axis ``fixes``).
"""

from __future__ import annotations

import torch.distributed as dist

from .. import catalog
from ..mesh import TP as TP_DIM
from .torch_backend import TorchBackend


class ReferenceBackend(TorchBackend):
    name = "reference"
    recipes = catalog.RECIPES_BY_BACKEND["reference"]

    def build(self, case, mesh, mesh_spec, seed: int, device):
        from ..reference import fixes, modules as ref
        from ..worker import modules as canonical_modules
        from ..worker import parallel
        fixes.configure(case.ax.get("fixes", "all"))
        canonical = canonical_modules.build(case.ax["module"], case.model, seed).state_dict()
        tp = ref.TP()
        if mesh_spec.tp > 1:
            tp_mesh = mesh[TP_DIM]
            tp = ref.TP(mesh_spec.tp, tp_mesh.get_local_rank(), tp_mesh.get_group(), tp_mesh)
        # Delayed-scaling activation / gradient amaxes are reduced over all ranks (TE's default
        # amax_reduction_group): the histories are replicated buffers and must agree.
        env = ref.Env(case.recipe, tp, weight_group=parallel.weight_group(mesh, mesh_spec),
                      world_group=dist.group.WORLD)
        model = ref.build_meta(case.ax["module"], case.model, env)
        parallel.shard(model, mesh, mesh_spec, case.recipe)
        return ref.materialize(model, canonical, device)

    def optimizer(self, model, case):
        from ..reference.optim import MasterAdam
        return MasterAdam(model.parameters(), lr=case.train.lr)

    def autocast(self, case):
        from ..reference.linear import autocast
        return autocast(True)

    def canonical_names(self, model) -> dict:
        return model.canonical_names()

    def checks(self, case) -> dict:
        from ..checks import quantized
        return {**super().checks(case), **quantized.CHECKS}


BACKEND = ReferenceBackend()
