"""The te backend's LlamaStack: TransformerEngine layers in the shape of TE PR #2713's Llama3
recipe (bionemo-recipes).

    embed (torch.nn.Embedding) -> layers (N x te.TransformerLayer, LayerNorm, causal) ->
    norm (te.LayerNorm) -> lm_head (te.Linear, no bias, weight tied to the embedding) -> logits

The embedding and the tied head stay high precision: the head is built outside
``te.quantized_model_init`` and runs under ``te.autocast(enabled=False)``; only the decoder
layers are quantized. The head's ``weight`` is the embedding's parameter object.

TE's ``reset_parameters`` re-registers the head's weight as a new parameter (module_setattr):
the backend re-ties it after (``parallel.retie``). With a TP mesh: DTensor TP on the embedding
(vocabulary rows ``Shard(0)``, as ``RowwiseParallel``; the lookup summed over TP with c10d,
distributed/tp_output.py), TE TP in the layers (``set_parallel_mode``
+ PR #2713's ``set_device_mesh``: TE's own, or the bundled port, backends/te_tp) and on the head
(``parallel_mode="column"`` over the vocabulary: its local weight is the embedding's local
``Shard(0)`` rows, so no ``set_device_mesh`` for the head, as the PR says), the head's
vocabulary-sharded logits gathered over TP.
"""

from __future__ import annotations

import torch
from torch import nn


class TELlamaStack(nn.Module):
    def __init__(self, te, d, device, tp_mesh=None, weight_mesh=None):
        super().__init__()
        self.tp_mesh = tp_mesh
        self._autocast = te.autocast  # the head runs outside the recipe
        common = dict(params_dtype=torch.float32, device=device)
        tp = {}
        if tp_mesh is not None:
            tp = dict(tp_group=tp_mesh.get_group(), tp_size=tp_mesh.size())
        self.embed = nn.Embedding(d.vocab, d.hidden, device=device)
        # unit-RMS logits at init, as the torch LlamaStack (distributed/modules.py): the tied head
        # multiplies by the same weight; N(0, 1) made the FP32 reference's first loss ~246
        nn.init.normal_(self.embed.weight, 0.0, d.hidden ** -0.5)
        # bias=False: see TEBackend.make (a key bias has an identically-zero gradient)
        self.layers = nn.ModuleList(
            te.TransformerLayer(d.hidden, d.ffn, d.heads, hidden_dropout=0.0,
                                attention_dropout=0.0, fuse_qkv_params=True, bias=False,
                                attn_input_format="bshd", self_attn_mask_type="causal",
                                **({"set_parallel_mode": True, **tp} if tp else {}), **common)
            for _ in range(d.layers))
        self.norm = te.LayerNorm(d.hidden, **common)
        with te.quantized_model_init(enabled=False):  # the tied head stays high precision
            self.lm_head = te.Linear(d.hidden, d.vocab, bias=False,
                                     **({"parallel_mode": "column", **tp} if tp else {}), **common)
        if tp_mesh is not None:
            from torch.distributed.tensor import Shard, distribute_tensor
            # the vocabulary rows sharded as RowwiseParallel shards them; forward looks up
            # through tp_output (c10d, not RowwiseParallel's functional all-reduce)
            self.embed.weight = nn.Parameter(distribute_tensor(
                self.embed.weight.data, tp_mesh, [Shard(0)]))
            from harness.backends.te_tp.port import localize, set_device_mesh
            for layer in self.layers:
                set_device_mesh(layer, tp_mesh, weight_mesh)
            localize(self.lm_head)  # its tied weight is the embedding's DTensor
        self.lm_head.weight = self.embed.weight  # tied (a DTensor Shard(0) with TP)

    def forward(self, ids):
        if self.tp_mesh is None:
            h = self.embed(ids)
        else:
            from harness.distributed.tp_output import vocab_sharded_embedding
            h = vocab_sharded_embedding(ids, self.embed.weight, self.tp_mesh.get_group())
        for layer in self.layers:
            h = layer(h)
        with self._autocast(enabled=False):  # the head (and final norm) stay high precision
            logits = self.lm_head(self.norm(h))
        if self.tp_mesh is None:
            return logits
        from harness.distributed.tp_output import gather_last_dim
        return gather_last_dim(logits, self.tp_mesh.get_group())

    def fsdp_units(self):
        return list(self.layers)
