"""TransformerEngine backend: real TE modules, recipes and FusedAdam on CUDA.

The same scenario files run here as on the plain-torch and reference backends. What TE can do
is detected, never assumed from a version number:

* recipes: TE's own availability checks (``te.is_fp8_available(return_reason=True)``, ...);
  a recipe the GPU cannot run is a skip carrying TE's reason;
* FSDP2 x TP: needs ``set_device_mesh`` on TE modules (TE PR #2713); without it TP cases skip;
* HSDP: TE's ``reset_parameters`` looks the shard group up as ``mesh["shard"]``, so this
  backend names the mesh dims ``replicate`` / ``shard`` / ``tp``.

Models follow TE's FSDP2 recipe: build on ``device="meta"`` under ``te.quantized_model_init``,
``fully_shard`` each child then the root, ``reset_parameters()``; then the weights of an FP32 TE
module of the same seed are loaded (``set_model_state_dict``, full state dict) so the FP32
single-process reference -- the same TE module class, unquantized -- starts from the same values.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from .. import catalog
from .torch_backend import TorchBackend

RECIPE_CLASS = {"delayed": "DelayedScaling", "current": "Float8CurrentScaling",
                "block": "Float8BlockScaling", "mxfp8": "MXFP8BlockScaling",
                "nvfp4": "NVFP4BlockScaling"}
AVAILABLE = {"delayed": "is_fp8_available", "current": "is_fp8_available",
             "block": "is_fp8_block_scaling_available", "mxfp8": "is_mxfp8_available",
             "nvfp4": "is_nvfp4_available"}
MESH_NAMES = {"dp_replicate": "replicate", "dp_shard": "shard", "tp": "tp"}


@functools.lru_cache(maxsize=1)
def _import():
    try:
        import transformer_engine
        import transformer_engine.pytorch as te
        return te, transformer_engine.__version__, None
    except Exception as e:  # noqa: BLE001 - any import failure is a skip reason
        return None, None, f"{type(e).__name__}: {e}"


class TEBackend(TorchBackend):
    name = "te"
    recipes = catalog.RECIPES_BY_BACKEND["te"]
    mesh_names = MESH_NAMES

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
        tp = max(case.mesh.tp, case.target.tp if case.target else 1)
        if tp > 1 and not hasattr(te.Linear, "set_device_mesh"):
            return (f"TE {version} has no set_device_mesh (TE PR #2713, unmerged): TE modules "
                    f"cannot hand FSDP2/DCP their TP shards as DTensors")
        return None

    def versions(self) -> dict[str, str]:
        _, version, _ = _import()
        return {"te": version} if version else {}

    # --- worker ---------------------------------------------------------------------------
    def recipe(self, case):
        if case.recipe not in RECIPE_CLASS:
            return None
        from transformer_engine.common import recipe as te_recipe
        return getattr(te_recipe, RECIPE_CLASS[case.recipe])()

    def quantized(self, case) -> bool:
        return case.recipe in RECIPE_CLASS

    def make(self, case, device: str):
        te, _, _ = _import()
        d, kind = case.model, case.ax["module"]
        common = dict(params_dtype=torch.float32, device=device)
        if kind == "Linear":
            return te.Linear(d.hidden, d.out_features, **common)
        if kind == "LayerNormLinear":
            return te.LayerNormLinear(d.hidden, d.out_features, **common)
        if kind == "LayerNormMLP":
            return te.LayerNormMLP(d.hidden, d.ffn, **common)
        # bias=False: a key bias has an identically-zero gradient (softmax shift invariance) and
        # Adam would turn rounding noise into O(lr) updates no two runs share.
        if kind == "MultiheadAttention":
            return te.MultiheadAttention(d.hidden, d.heads, attention_dropout=0.0,
                                         input_layernorm=True, fuse_qkv_params=True, bias=False,
                                         qkv_format="bshd", attn_mask_type="causal", **common)
        if kind == "TransformerLayer":
            return te.TransformerLayer(d.hidden, d.ffn, d.heads, hidden_dropout=0.0,
                                       attention_dropout=0.0, fuse_qkv_params=True, bias=False,
                                       attn_input_format="bshd", self_attn_mask_type="causal",
                                       **common)
        raise ValueError(kind)

    def reference_model(self, case, seed: int, device):
        """The FP32 reference: the same TE module, unquantized, on one GPU."""
        with torch.random.fork_rng(devices=[device.index] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            return self.make(case, str(device))

    def build(self, case, mesh, mesh_spec, seed: int, device):
        from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                              set_model_state_dict)

        from ..worker import parallel
        te, _, _ = _import()
        with te.quantized_model_init(enabled=self.quantized(case), recipe=self.recipe(case)):
            model = self.make(case, "meta")
        units = list(model.children()) if case.ax["module"] == "TransformerLayer" else []
        parallel.shard(model, mesh, mesh_spec, case.recipe, units=units, names=self.mesh_names)
        for m in model.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
        # Keep the reference's (empty, FP8 unused) _extra_state entries: without them torch's
        # set_model_state_dict hands its _EXTRA_STATE placeholder to TE's set_extra_state,
        # which raises "Unsupported checkpoint format." (seen with TE 2.20.2 / torch 2.11).
        full = self.reference_model(case, seed, device).state_dict()
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True))
        return model

    def optimizer(self, model, case):
        """FusedAdam; fp32 master weights for quantized params unless the case's ``optimizer``
        axis says ``no_master_weights``."""
        from transformer_engine.pytorch.optimizers import FusedAdam
        master = self.quantized(case) and case.ax.get("optimizer") != "no_master_weights"
        return FusedAdam(model.parameters(), lr=case.train.lr, master_weights=master,
                         master_weight_dtype=torch.float32)

    def autocast(self, case):
        te, _, _ = _import()
        if not self.quantized(case):
            return contextlib.nullcontext()
        return te.autocast(enabled=True, recipe=self.recipe(case))

    def checks(self, case) -> dict:
        from ..checks import te_checks
        return {**super().checks(case), **te_checks.CHECKS}


BACKEND = TEBackend()
