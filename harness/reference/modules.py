"""TE-style modules in pure PyTorch: the same roles and parameter names as TransformerEngine's.

Tensor parallelism works like TE's: a module is built for its TP rank with local weight shards
(column-parallel: output rows; row-parallel: input columns) and runs its own collectives
(linear.py). ``set_device_mesh`` (fixes/tp_dtensor_params.py) then turns the shards into
DTensors for FSDP2 and DCP. ``quantize_weights`` replaces 2-D weights by QuantizedTensor
parameters (like ``te.quantized_model_init``). Weights are initialized from the harness's
canonical plain-torch module of the same seed, so the FP32 reference starts from the same
values; ``CANONICAL`` maps each parameter to its canonical name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from harness.reference.fixes import tp_dtensor_params
from harness.reference.fixes.tp_dtensor_params import local
from harness.reference.linear import (
    copy_to_tp,
    gather_from_tp,
    quantized_linear,
    reduce_from_tp,
)
from harness.reference.quantizers import QuantState, WeightQuantizer
from harness.spec.scenario import ModelDims

QUANTIZED = ("delayed", "current", "block", "mxfp8", "nvfp4")


@dataclass
class TP:
    size: int = 1
    rank: int = 0
    group: object = None  # None when size == 1
    mesh: object = None  # 1-D TP DeviceMesh (for set_device_mesh)


@dataclass
class Env:
    recipe: str
    tp: TP
    weight_group: object = None  # ranks holding pieces of a weight: dp_shard x tp
    world_group: object = None  # activation amax reduction (delayed scaling)


# param name -> (canonical name, TP kind: column | row | replicate, shape(d) of the full tensor)
class TEModule(nn.Module):
    PARAMS: dict = {}
    GEMMS: dict = {}  # gemm name -> (weight param, bias param or None)

    def __init__(self, d: ModelDims, env: Env):
        super().__init__()
        self.env = env
        for name, (_, kind, shape_fn) in self.PARAMS.items():
            shape = list(shape_fn(d))
            if kind == "column":
                shape[0] //= env.tp.size
            elif kind == "row":
                shape[1] //= env.tp.size
            self.register_parameter(name, nn.Parameter(torch.empty(shape)))
        self.quantizers = {}
        if env.recipe == "delayed":
            for gemm in self.GEMMS:
                self.add_module(f"{gemm}_quant", QuantState())

    def _state(self, gemm):
        return getattr(self, f"{gemm}_quant", None)

    def linear(self, gemm: str, x):
        w_name, b_name = self.GEMMS[gemm]
        b = local(getattr(self, b_name)) if b_name else None
        return quantized_linear(x, local(getattr(self, w_name)), b, self.env.recipe,
                                self._state(gemm), self.quantizers.get(w_name),
                                self.env.world_group)

    @torch.no_grad()
    def quantize_weights(self) -> None:
        """Quantized primary weights (te.quantized_model_init): each GEMM's 2-D weight becomes a
        QuantizedTensor parameter. On the meta device the parts are meta too; values come in
        ``reset_parameters`` after ``fully_shard``."""
        if self.env.recipe not in QUANTIZED:
            return
        for gemm, (w_name, _) in self.GEMMS.items():
            q = WeightQuantizer(self.env.recipe, self.env.weight_group, self._state(gemm))
            self.quantizers[w_name] = q
            w = getattr(self, w_name)
            qt = q.empty(w.shape, w.device) if w.is_meta else q.quantize(w.detach())
            setattr(self, w_name, nn.Parameter(qt, requires_grad=True))

    @torch.no_grad()
    def reset_parameters(self, full: dict, prefix: str = "") -> None:
        """Initialize (after ``fully_shard`` + ``to_empty``) every parameter shard this rank
        holds from the canonical full tensors; quantized shards are quantized in place (their
        amax reduced over the weight's shard group, as after every optimizer step)."""
        for st in self.modules():
            if isinstance(st, QuantState):
                st.reset()
        for name, (canon, kind, _) in self.PARAMS.items():
            p = getattr(self, name)
            t = full[prefix + canon].to(p.device)
            if tuple(p.shape) != tuple(t.shape):  # a plain TP shard (no set_device_mesh)
                t = _tp_slice(t, kind, self.env.tp)
            local = p._local_tensor if isinstance(p, DTensor) else p
            if isinstance(p, DTensor):
                shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh,
                                                                      p.placements)
                t = t[tuple(slice(o, o + n) for o, n in zip(offset, shape))]
            if name in self.quantizers:
                self.quantizers[name].quantize_into(local, t)
            else:
                local.copy_(t)

    def set_device_mesh(self) -> None:
        if self.env.tp.size > 1:
            tp_dtensor_params.set_device_mesh(self, self.env.tp.mesh,
                                              {n: k for n, (_, k, _) in self.PARAMS.items()})

    def canonical_names(self, prefix="", canon_prefix="") -> dict:
        return {prefix + n: canon_prefix + c for n, (c, _, _) in self.PARAMS.items()}

    def _norm(self, x, w="layer_norm_weight", b="layer_norm_bias"):
        return F.layer_norm(x, (x.shape[-1],), local(getattr(self, w)), local(getattr(self, b)))


def _tp_slice(t, kind: str, tp: TP):
    if kind == "column":
        return t.chunk(tp.size, 0)[tp.rank]
    if kind == "row":
        return t.chunk(tp.size, 1)[tp.rank]
    return t


def _vec(n):
    return lambda d: (getattr(d, n),)


_NORM = {"layer_norm_weight": ("layer_norm.weight", "replicate", _vec("hidden")),
         "layer_norm_bias": ("layer_norm.bias", "replicate", _vec("hidden"))}


class Linear(TEModule):
    PARAMS = {"weight": ("proj.weight", "column", lambda d: (d.out_features, d.hidden)),
              "bias": ("proj.bias", "column", _vec("out_features"))}
    GEMMS = {"proj": ("weight", "bias")}

    def forward(self, x):
        g = self.env.tp.group
        return gather_from_tp(self.linear("proj", copy_to_tp(x, g)), g)


class LayerNormLinear(TEModule):
    PARAMS = {**_NORM, **Linear.PARAMS}
    GEMMS = Linear.GEMMS

    def forward(self, x):
        g = self.env.tp.group
        return gather_from_tp(self.linear("proj", copy_to_tp(self._norm(x), g)), g)


class LayerNormMLP(TEModule):
    PARAMS = {**_NORM,
              "fc1_weight": ("fc1.weight", "column", lambda d: (d.ffn, d.hidden)),
              "fc1_bias": ("fc1.bias", "column", _vec("ffn")),
              "fc2_weight": ("fc2.weight", "row", lambda d: (d.hidden, d.ffn)),
              "fc2_bias": ("fc2.bias", "replicate", _vec("hidden"))}
    GEMMS = {"fc1": ("fc1_weight", "fc1_bias"), "fc2": ("fc2_weight", None)}

    def forward(self, x):
        g = self.env.tp.group
        h = F.gelu(self.linear("fc1", copy_to_tp(self._norm(x), g)), approximate="tanh")
        return reduce_from_tp(self.linear("fc2", h), g) + local(self.fc2_bias)


class MultiheadAttention(TEModule):
    PARAMS = {**_NORM,
              "query_weight": ("q.weight", "column", lambda d: (d.hidden, d.hidden)),
              "query_bias": ("q.bias", "column", _vec("hidden")),
              "key_weight": ("k.weight", "column", lambda d: (d.hidden, d.hidden)),
              "value_weight": ("v.weight", "column", lambda d: (d.hidden, d.hidden)),
              "value_bias": ("v.bias", "column", _vec("hidden")),
              "proj_weight": ("out.weight", "row", lambda d: (d.hidden, d.hidden)),
              "proj_bias": ("out.bias", "replicate", _vec("hidden"))}
    GEMMS = {"query": ("query_weight", "query_bias"), "key": ("key_weight", None),
             "value": ("value_weight", "value_bias"), "proj": ("proj_weight", None)}

    def __init__(self, d: ModelDims, env: Env):
        super().__init__(d, env)
        self.head_dim = d.hidden // d.heads

    def forward(self, x):
        g = self.env.tp.group
        b, s, _ = x.shape
        h = copy_to_tp(self._norm(x), g)
        q, k, v = (self.linear(n, h).view(b, s, -1, self.head_dim).transpose(1, 2)
                   for n in ("query", "key", "value"))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = self.linear("proj", a.transpose(1, 2).reshape(b, s, -1))
        return reduce_from_tp(out, g) + local(self.proj_bias)


class TransformerLayer(nn.Module):
    def __init__(self, d: ModelDims, env: Env):
        super().__init__()
        self.self_attention = MultiheadAttention(d, env)
        self.layernorm_mlp = LayerNormMLP(d, env)

    def forward(self, x):
        x = x + self.self_attention(x)
        return x + self.layernorm_mlp(x)

    def parts(self):
        return (("self_attention.", "self_attention.", self.self_attention),
                ("layernorm_mlp.", "mlp.", self.layernorm_mlp))

    def reset_parameters(self, full: dict, prefix: str = "") -> None:
        for _, canon, m in self.parts():
            m.reset_parameters(full, prefix + canon)

    def quantize_weights(self) -> None:
        for _, _, m in self.parts():
            m.quantize_weights()

    def set_device_mesh(self) -> None:
        for _, _, m in self.parts():
            m.set_device_mesh()

    def canonical_names(self, prefix: str = "", canon_prefix: str = "") -> dict:
        out = {}
        for name, canon, m in self.parts():
            out.update(m.canonical_names(prefix + name, canon_prefix + canon))
        return out

    def fsdp_units(self):
        return [self.self_attention, self.layernorm_mlp]
