"""Building a reference module by name: the table of the module axis's values, the meta-device
build (TP-local, quantized, TP params as DTensors) and the materialization after ``fully_shard``."""

from __future__ import annotations

import torch
from torch import nn

from harness.reference.llama_stack import LlamaStack
from harness.reference.modules import (
    TP,  # noqa: F401 - re-exported: a reference module's TP context
    Env,
    LayerNormLinear,
    LayerNormMLP,
    Linear,
    MultiheadAttention,
    TransformerLayer,
)
from harness.spec.scenario import ModelDims

MODULES = {c.__name__: c for c in (Linear, LayerNormLinear, LayerNormMLP, MultiheadAttention,
                                    TransformerLayer, LlamaStack)}


def build_meta(kind: str, d: ModelDims, env: Env) -> nn.Module:
    """The module for this rank on the meta device (TE's ``device="meta"`` under
    ``quantized_model_init``): TP-local shapes, quantized primary weights for quantized recipes,
    TP params as DTensors (fix tp_dtensor_params). Shard it, then ``materialize``."""
    with torch.device("meta"):
        m = MODULES[kind](d, env)
    m.quantize_weights()
    m.set_device_mesh()
    return m


def materialize(m: nn.Module, canonical: dict, device) -> nn.Module:
    """After ``fully_shard``: allocate this rank's shards on ``device`` and initialize them."""
    m.to_empty(device=device)
    m.reset_parameters(canonical)
    return m
