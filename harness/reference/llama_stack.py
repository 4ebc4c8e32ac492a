"""The reference backend's LlamaStack: the TE-style modules of ``modules.py`` in a decoder-only
language model with the plain-torch LlamaStack's canonical names (``distributed/modules.py``).

    embed (vocab-parallel, high precision) -> layers (N x TransformerLayer: the quantized
    TE-style attention and MLP) -> norm -> lm_head (tied: the embedding's weight, column-parallel
    over the vocabulary, high precision) -> logits

Like TE PR #2713's Llama3 recipe, the embedding and the tied head are not quantized: only the
decoder's projections run quantized GEMMs. Tensor parallelism is the modules' own: the
embedding holds its vocabulary rows (``Shard(0)`` after ``set_device_mesh``), looks up the ids
it owns and sums over TP; the head multiplies by the same local rows and gathers the logits.
The head's ``weight`` is the embedding's parameter object (re-tied after ``set_device_mesh``
replaced it by a DTensor).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from harness.distributed.tp_output import vocab_sharded_lookup
from harness.reference.fixes.tp_dtensor_params import local
from harness.reference.linear import copy_to_tp, gather_from_tp
from harness.reference.modules import Env, TEModule, TransformerLayer, _vec
from harness.spec.scenario import ModelDims


class Embedding(TEModule):
    PARAMS = {"weight": ("embed.weight", "column", lambda d: (d.vocab, d.hidden))}

    def forward(self, ids):
        w, tp = local(self.weight), self.env.tp
        if tp.group is None:
            return F.embedding(ids, w)
        return vocab_sharded_lookup(ids, w, tp.rank * w.shape[0], tp.group)


class LayerNorm(TEModule):
    PARAMS = {"weight": ("norm.weight", "replicate", _vec("hidden")),
              "bias": ("norm.bias", "replicate", _vec("hidden"))}

    def forward(self, x):
        return self._norm(x, "weight", "bias")


class TiedHead(nn.Module):
    """The LM head: ``logits = h @ embed.weight^T``, vocab-parallel, logits gathered over TP."""

    def __init__(self, embed: Embedding):
        super().__init__()
        self.group = embed.env.tp.group
        self.weight = embed.weight

    def forward(self, h):
        return gather_from_tp(F.linear(copy_to_tp(h, self.group), local(self.weight)), self.group)


class LlamaStack(nn.Module):
    def __init__(self, d: ModelDims, env: Env):
        super().__init__()
        self.embed = Embedding(d, env)
        self.layers = nn.ModuleList(TransformerLayer(d, env) for _ in range(d.layers))
        self.norm = LayerNorm(d, env)
        self.lm_head = TiedHead(self.embed)

    def forward(self, ids):
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(self.norm(h))

    def quantize_weights(self) -> None:
        for layer in self.layers:  # the embedding and the tied head stay high precision
            layer.quantize_weights()

    def set_device_mesh(self) -> None:
        for m in (self.embed, *self.layers, self.norm):
            m.set_device_mesh()
        self.lm_head.weight = self.embed.weight  # the embedding's (new) DTensor parameter

    def reset_parameters(self, full: dict) -> None:
        self.embed.reset_parameters(full)
        for i, layer in enumerate(self.layers):
            layer.reset_parameters(full, f"layers.{i}.")
        self.norm.reset_parameters(full)

    def canonical_names(self) -> dict:
        out = {**self.embed.canonical_names("embed."), **self.norm.canonical_names("norm."),
               "lm_head.weight": "lm_head.weight"}
        for i, layer in enumerate(self.layers):
            out.update(layer.canonical_names(f"layers.{i}.", f"layers.{i}."))
        return out

    def fsdp_units(self):
        return [u for layer in self.layers for u in layer.fsdp_units()]
