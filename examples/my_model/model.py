"""Bring your own model: the example to copy.

The harness imports ``build`` and ``plan`` by the import paths in ``my_model.yaml``:

``build(ctx)``        returns the whole (unsharded) model for ``ctx.dims`` on ``ctx.device``;
                      the harness calls it on every rank under the same seed, and once more
                      (``ctx.mesh is None``, ``ctx.recipe == "fp32"``) for the single-process FP32
                      reference. ``ctx`` is ``harness.spec.models.ModelContext``.
``plan(model, ctx)``  how tensor parallelism shards it: a ``parallelize_module`` plan
                      {submodule name: ParallelStyle}, applied on ``ctx.tp_mesh`` (TP meshes only).
``fsdp_units()``      (optional, on the model) the submodules FSDP2 shards as units of their
                      own; the root is always one.

This one is a tiny language model (task ``next_token``: token ids in, logits out, cross-entropy)
whose LM head is tied to its embedding, so the ``tied_weights`` check has something to hold.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel


class Block(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x)), approximate="tanh"))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, hidden: int, ffn: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        nn.init.normal_(self.embed.weight, 0.0, hidden ** -0.5)
        self.blocks = nn.ModuleList(Block(hidden, ffn) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.embed.weight  # tied

    def forward(self, ids):
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h)
        return self.lm_head(self.norm(h))

    def fsdp_units(self):
        return list(self.blocks)


def build(ctx) -> nn.Module:
    d = ctx.dims
    with torch.device(ctx.device):
        return TinyLM(d.vocab, d.hidden, d.ffn, d.layers).to(ctx.dtype)


def plan(model: TinyLM, ctx) -> dict:
    out = {"embed": RowwiseParallel(input_layouts=Replicate()),  # vocabulary rows sharded
           "lm_head": ColwiseParallel(output_layouts=Replicate())}  # the same rows, logits gathered
    for i in range(len(model.blocks)):
        out[f"blocks.{i}.up"] = ColwiseParallel()
        out[f"blocks.{i}.down"] = RowwiseParallel()
    return out
