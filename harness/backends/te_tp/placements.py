"""(a) The DTensor placement of each TE parameter on the TP mesh, as PR #2713 assigns them.

A pure function of (module class name, parallel_mode, parameter name): no TE needed. TE builds a
module for its TP rank with local shards -- column-parallel GEMMs split the output rows,
row-parallel ones the input columns -- so the placement says which dim of the whole tensor the
local shard is a piece of:

    Linear / LayerNormLinear  column: weight, bias Shard(0)     row: weight Shard(1), bias Replicate
                              None (no TP split): Replicate
                              layer_norm_weight / _bias: Replicate (row: Shard(0); TE refuses it)
    LayerNormMLP              fc1_weight, fc1_bias Shard(0); fc2_weight Shard(1); fc2_bias,
                              layer_norm_weight / _bias Replicate (tp_size > 1 always splits)
    LayerNorm / RMSNorm       weight, bias Replicate
    DotProductAttention       softmax_offset Shard(0) (one per local head)
    MultiheadAttention        its children (set_parallel_mode=True): layernorm_qkv / qkv /
                              layernorm_query / query_layer / key_value column, proj row,
                              core_attention DotProductAttention
    TransformerLayer          self_attention / inter_attention MultiheadAttention, layernorm_mlp
                              LayerNormMLP, layernorm LayerNorm

Composite classes take dotted names (``self_attention.proj.weight``); parameters are owned by
the leaf classes, which is where the port applies the rules (:func:`module_placements`).
"""

from __future__ import annotations

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

COLUMN, ROW = "column", "row"
PARALLEL_MODES = (None, COLUMN, ROW)
GEMMS = ("Linear", "LayerNormLinear")
NORMS = ("LayerNorm", "RMSNorm")
MLP = {"fc1_weight": Shard(0), "fc1_bias": Shard(0), "fc2_weight": Shard(1),
       "fc2_bias": Replicate(), "layer_norm_weight": Replicate(), "layer_norm_bias": Replicate()}
# composite class -> child attribute -> (child class, child parallel_mode), as TE builds them
# with set_parallel_mode=True
CHILDREN = {
    "MultiheadAttention": {
        "layernorm_qkv": ("LayerNormLinear", COLUMN), "qkv": ("Linear", COLUMN),
        "layernorm_query": ("LayerNormLinear", COLUMN), "query_layer": ("Linear", COLUMN),
        "key_value": ("Linear", COLUMN), "proj": ("Linear", ROW),
        "core_attention": ("DotProductAttention", None)},
    "TransformerLayer": {
        "self_attention": ("MultiheadAttention", None),
        "inter_attention": ("MultiheadAttention", None),
        "layernorm_mlp": ("LayerNormMLP", None), "layernorm": ("LayerNorm", None)},
}
LEAVES = GEMMS + NORMS + ("LayerNormMLP", "DotProductAttention")
CLASSES = LEAVES + tuple(CHILDREN)


def placement(cls_name: str, parallel_mode: str | None, param: str) -> Placement:
    """The placement of parameter ``param`` of a TE ``cls_name`` built with ``parallel_mode``
    (Linear / LayerNormLinear; ignored by the others). ValueError for anything unknown."""
    if cls_name in CHILDREN:
        child, _, rest = param.partition(".")
        if child not in CHILDREN[cls_name] or not rest:
            raise ValueError(f"{cls_name} has no TP child {child!r} (parameter {param!r}); "
                             f"children: {', '.join(CHILDREN[cls_name])}")
        sub_cls, sub_mode = CHILDREN[cls_name][child]
        return placement(sub_cls, sub_mode, rest)
    if cls_name in GEMMS:
        if parallel_mode not in PARALLEL_MODES:
            raise ValueError(f"{cls_name}: parallel_mode {parallel_mode!r} is none of "
                             f"{PARALLEL_MODES}")
        if cls_name == "LayerNormLinear" and param in ("layer_norm_weight", "layer_norm_bias"):
            return Shard(0) if parallel_mode == ROW else Replicate()
        if param.endswith("weight"):  # weight, or <split>_weight (parameters_split)
            return {COLUMN: Shard(0), ROW: Shard(1)}.get(parallel_mode, Replicate())
        if param.endswith("bias"):
            return Shard(0) if parallel_mode == COLUMN else Replicate()
    elif cls_name == "LayerNormMLP" and param in MLP:
        return MLP[param]
    elif cls_name in NORMS and param in ("weight", "bias"):
        return Replicate()
    elif cls_name == "DotProductAttention" and param == "softmax_offset":
        return Shard(0)
    elif cls_name not in CLASSES:
        raise ValueError(f"no TP placement rules for class {cls_name!r}; known: "
                         f"{', '.join(CLASSES)}")
    raise ValueError(f"no TP placement rule for {cls_name}.{param}")


def rule_class(module) -> str | None:
    """The TE class whose rules apply to ``module``: the first of its classes (MRO: FSDP2's
    ``FSDPLinear`` is a ``Linear``) named in :data:`CLASSES`; None for anything else."""
    for klass in type(module).__mro__:
        if klass.__name__ in CLASSES:
            return klass.__name__
    return None


def module_placements(module) -> dict[str, Placement]:
    """Placements of a leaf TE module's own parameters (name -> placement)."""
    cls = rule_class(module)
    if cls is None or cls in CHILDREN:
        return {}
    mode = getattr(module, "parallel_mode", None)
    return {name: placement(cls, mode, name)
            for name, _ in module.named_parameters(recurse=False)}


def table() -> list[tuple[str, str | None, str, str]]:
    """Every rule as (class, parallel_mode, parameter, placement) rows, for docs and reports."""
    rows = []
    for cls in GEMMS:
        names = ["weight", "bias"] + (["layer_norm_weight", "layer_norm_bias"]
                                      if cls == "LayerNormLinear" else [])
        rows += [(cls, m, n, repr(placement(cls, m, n))) for m in (COLUMN, ROW, None)
                 for n in names]
    rows += [("LayerNormMLP", None, n, repr(p)) for n, p in MLP.items()]
    rows += [(c, None, n, repr(placement(c, None, n))) for c in NORMS for n in ("weight", "bias")]
    rows.append(("DotProductAttention", None, "softmax_offset",
                 repr(placement("DotProductAttention", None, "softmax_offset"))))
    return rows
