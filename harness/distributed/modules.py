"""Small plain-torch modules with the roles of TransformerEngine's.

Each takes and returns [batch, seq, features] tensors (LlamaStack: token ids -> logits, below), and exposes ``tp_plan()`` for ``parallelize_module`` (colwise / rowwise)
and ``fsdp_units()`` for ``fully_shard``.
Parameter names are the harness's canonical names; other backends map theirs onto these.

LlamaStack: a small decoder-only language model, the shape of TE PR #2713's Llama3 recipe.

    token ids -> embed (nn.Embedding) -> layers (N x TransformerLayer: pre-norm causal
    attention + MLP) -> norm (LayerNorm) -> lm_head (nn.Linear, weight tied to embed) -> logits

N is ``model.layers``, the vocabulary ``model.vocab``. The LM head's weight *is* the
embedding's parameter (one tensor, two names: ``embed.weight`` and ``lm_head.weight``).

TP (``tp_plan``) follows the recipe: DTensor TP on the embedding (``RowwiseParallel``: vocab
rows sharded, ``Shard(0)``), column-parallel LM head over the vocabulary (the same ``Shard(0)``
of the same weight, logits gathered), Megatron-style column / row projections in each layer.
``parallelize_module`` distributes the head's and the embedding's weight separately; the
harness re-ties them (``parallel.parallelize``). FSDP2 units: each layer's attention and MLP;
the embedding, final norm and head stay in the root unit (a tied parameter lives in one unit).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from harness.spec.scenario import ModelDims


class Linear(nn.Module):
    def __init__(self, d: ModelDims):
        super().__init__()
        self.proj = nn.Linear(d.hidden, d.out_features)

    def forward(self, x):
        return self.proj(x)

    def tp_plan(self):
        return {"proj": ColwiseParallel(output_layouts=Replicate())}


class LayerNormLinear(nn.Module):
    def __init__(self, d: ModelDims):
        super().__init__()
        self.layer_norm = nn.LayerNorm(d.hidden)
        self.proj = nn.Linear(d.hidden, d.out_features)

    def forward(self, x):
        return self.proj(self.layer_norm(x))

    def tp_plan(self):
        return {"proj": ColwiseParallel(output_layouts=Replicate())}


class LayerNormMLP(nn.Module):
    def __init__(self, d: ModelDims):
        super().__init__()
        self.layer_norm = nn.LayerNorm(d.hidden)
        self.fc1 = nn.Linear(d.hidden, d.ffn)
        self.fc2 = nn.Linear(d.ffn, d.hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(self.layer_norm(x)), approximate="tanh"))

    def tp_plan(self, prefix: str = ""):
        return {f"{prefix}fc1": ColwiseParallel(), f"{prefix}fc2": RowwiseParallel()}


class MultiheadAttention(nn.Module):
    """Pre-norm self-attention. Heads split over TP: q/k/v colwise, out rowwise."""

    def __init__(self, d: ModelDims):
        super().__init__()
        self.head_dim = d.hidden // d.heads
        self.layer_norm = nn.LayerNorm(d.hidden)
        self.q = nn.Linear(d.hidden, d.hidden)
        # No key bias: softmax is invariant to it, so its gradient is identically zero and Adam
        # would turn rounding noise into O(lr) updates that no two runs share.
        self.k = nn.Linear(d.hidden, d.hidden, bias=False)
        self.v = nn.Linear(d.hidden, d.hidden)
        self.out = nn.Linear(d.hidden, d.hidden)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.layer_norm(x)
        # Local head count follows from the (possibly TP-sharded) projection width.
        q, k, v = (p(h).view(b, s, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(a.transpose(1, 2).reshape(b, s, -1))

    def tp_plan(self, prefix: str = ""):
        plan = {f"{prefix}{n}": ColwiseParallel() for n in ("q", "k", "v")}
        plan[f"{prefix}out"] = RowwiseParallel()
        return plan


class TransformerLayer(nn.Module):
    def __init__(self, d: ModelDims):
        super().__init__()
        self.self_attention = MultiheadAttention(d)
        self.mlp = LayerNormMLP(d)

    def forward(self, x):
        x = x + self.self_attention(x)
        return x + self.mlp(x)

    def tp_plan(self, prefix: str = ""):
        return {**self.self_attention.tp_plan(f"{prefix}self_attention."),
                **self.mlp.tp_plan(f"{prefix}mlp.")}

    def fsdp_units(self):
        return [self.self_attention, self.mlp]



class LlamaStack(nn.Module):
    def __init__(self, d: ModelDims):
        super().__init__()
        self.embed = nn.Embedding(d.vocab, d.hidden)
        # unit-RMS logits at init (the tied head multiplies by the same weight): a loss near
        # log(vocab) with gradients that are neither saturated nor vanishing
        nn.init.normal_(self.embed.weight, 0.0, d.hidden ** -0.5)
        self.layers = nn.ModuleList(TransformerLayer(d) for _ in range(d.layers))
        self.norm = nn.LayerNorm(d.hidden)
        self.lm_head = nn.Linear(d.hidden, d.vocab, bias=False)
        self.lm_head.weight = self.embed.weight  # tied

    def forward(self, ids):
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(self.norm(h))

    def tp_plan(self):
        plan = {"embed": RowwiseParallel(input_layouts=Replicate()),
                "lm_head": ColwiseParallel(output_layouts=Replicate())}
        for i, layer in enumerate(self.layers):
            plan.update(layer.tp_plan(f"layers.{i}."))
        return plan

    def fsdp_units(self):
        return [u for layer in self.layers for u in layer.fsdp_units()]


MODULES = {cls.__name__: cls for cls in (Linear, LayerNormLinear, LayerNormMLP, MultiheadAttention,
                                          TransformerLayer, LlamaStack)}


def build(kind: str, dims: ModelDims, seed: int, device="cpu") -> nn.Module:
    """Deterministic fp32 init: the same (kind, dims, seed) gives the same bytes on every rank."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = MODULES[kind](dims)
        # Non-trivial norm affine params, so a mix-up of weight and bias shows.
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                nn.init.normal_(m.weight, 1.0, 0.1)
                nn.init.normal_(m.bias, 0.0, 0.1)
    finally:
        torch.random.set_rng_state(gen_state)
    return model.to(device)
