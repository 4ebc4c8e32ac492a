"""The te backend's modules: what a case's module axis value builds from TransformerEngine."""

from __future__ import annotations

import torch


def make(te, case, backend_name: str, device: str, mesh=None, mesh_spec=None,
         seed: int | None = None):
    """The case's TE module on ``device`` (whole; TP-local where ``mesh_spec`` has TP):
    a TE module, the LlamaStack of TE layers, or the factory the module axis names."""
    d, kind = case.model, case.ax["module"]
    common = dict(params_dtype=torch.float32, device=device)
    if case.model_ref is not None:
        from harness.spec import models
        seed = case.train.seed if seed is None else seed
        return models.build(case.model_ref, models.context(
            case, backend_name, seed, device, mesh, mesh_spec, reference=mesh is None))
    if kind == "LlamaStack":
        from harness.backends.te_llama_stack import TELlamaStack
        from harness.spec.mesh import TP
        tp = mesh[TP] if mesh_spec is not None and mesh_spec.tp > 1 else None
        return TELlamaStack(te, d, device, tp)
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
