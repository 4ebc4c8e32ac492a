"""LlamaStack: a small decoder-only language model, the shape of TE PR #2713's Llama3 recipe.

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

from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from ..spec import ModelDims
from .modules import TransformerLayer


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
