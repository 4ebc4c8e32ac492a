"""The te backend's modules: what a case's module axis value builds from TransformerEngine.

With a TP mesh the TE modules are built for their TP rank (``tp_group`` / ``tp_size``; Linear and
LayerNormLinear column-parallel, LayerNormMLP / MultiheadAttention / TransformerLayer with
``set_parallel_mode``) and handed to PR #2713's ``set_device_mesh`` -- TE's own, or the bundled
port (backends/te_tp) -- with the FSDP shard x TP group as ``weight_mesh``. A column-parallel
module's output is a TP shard of the last dim: it is gathered, so every module returns what the
single-process FP32 reference returns.
"""

from __future__ import annotations

import torch

from harness.distributed.tp_output import gather_last_dim


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
    tp_mesh, weights, column, parallel = None, None, {}, {}
    if mesh_spec is not None and mesh_spec.tp > 1:
        from harness.distributed.parallel import weight_group
        from harness.spec.mesh import TP
        tp_mesh, weights = mesh[TP], weight_group(mesh, mesh_spec)
        tp = dict(tp_group=tp_mesh.get_group(), tp_size=tp_mesh.size())
        column, parallel = dict(parallel_mode="column", **tp), dict(set_parallel_mode=True, **tp)
    if kind == "LlamaStack":
        from harness.backends.te_llama_stack import TELlamaStack
        return TELlamaStack(te, d, device, tp_mesh, weights)
    if kind == "Linear":
        m = te.Linear(d.hidden, d.out_features, **column, **common)
    elif kind == "LayerNormLinear":
        m = te.LayerNormLinear(d.hidden, d.out_features, **column, **common)
    elif kind == "LayerNormMLP":
        m = te.LayerNormMLP(d.hidden, d.ffn, **parallel, **common)
    # bias=False: a key bias has an identically-zero gradient (softmax shift invariance) and
    # Adam would turn rounding noise into O(lr) updates no two runs share.
    elif kind == "MultiheadAttention":
        m = te.MultiheadAttention(d.hidden, d.heads, attention_dropout=0.0,
                                  input_layernorm=True, fuse_qkv_params=True, bias=False,
                                  qkv_format="bshd", attn_mask_type="causal", **parallel,
                                  **common)
    elif kind == "TransformerLayer":
        m = te.TransformerLayer(d.hidden, d.ffn, d.heads, hidden_dropout=0.0,
                                attention_dropout=0.0, fuse_qkv_params=True, bias=False,
                                attn_input_format="bshd", self_attn_mask_type="causal",
                                **parallel, **common)
    else:
        raise ValueError(kind)
    if tp_mesh is not None:
        from harness.backends.te_tp.port import set_device_mesh
        set_device_mesh(m, tp_mesh, weights)
        if kind in ("Linear", "LayerNormLinear"):  # column-parallel: output is a TP shard
            m._te_tp_output_mesh = tp_mesh
            m.register_forward_hook(gather_output)
    return m


def gather_output(module, args, out):
    """A column-parallel module's output, gathered over TP along its last dim (autograd:
    the backward hands each rank its slice of the gradient)."""
    return gather_last_dim(out, module._te_tp_output_mesh.get_group())
