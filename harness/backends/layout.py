"""Can this case's quantized weights be sharded on its meshes? Decided at collection.

Blocked formats scale blocks of a weight together: FP8 block scaling 128x128 blocks, MXFP8 32
elements (rowwise 1x32 and columnwise 32x1 copies), NVFP4 16. A shard boundary inside a block
would need one block scale across two ranks, so FSDP2's row shards (and TP's row / column
shards) must be multiples of the block size. The reference backend raises QuantizedLayoutError
deep inside FSDP2's ``fully_shard`` when they are not; TE falls back to high-precision
all-gathers or asserts. :func:`skip_reason` says so before any launch, naming the weight, the
mesh, the rows (or columns) per shard and the block size -- for the case's mesh and its reshard
target. Weights all-gathered quantized (every quantized recipe, per-tensor too) must also shard
evenly: :func:`uneven_problem`. And TE's quantized GEMMs need every dim a multiple of 16
elements -- the tokens each rank multiplies and the weights' TP-local dims:
:func:`gemm_problem`.

How a mesh cuts a weight [rows x cols] (harness/distributed/parallel.py, reference/modules.py):
TP first (column-parallel weights by rows, row-parallel ones by columns, ``tp`` pieces), then
FSDP2 chunks the TP-local rows over the shard dim (``ceil(rows / shard)`` rows per rank; HSDP's
replicate dim does not cut).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.spec import catalog
from harness.spec.mesh import MeshSpec


@dataclass(frozen=True)
class Weight:
    name: str
    rows: int
    cols: int
    tp: str  # "column" (TP splits rows), "row" (TP splits columns) or "replicate"

    def local(self, mesh: MeshSpec) -> tuple[int, int]:
        """(rows, cols) of a TP rank's piece of it on ``mesh`` (FSDP2 then chunks the rows)."""
        return (self.rows // mesh.tp if self.tp == "column" else self.rows,
                self.cols // mesh.tp if self.tp == "row" else self.cols)


@dataclass(frozen=True)
class Blocks:
    """A format's block size along each dim of a weight, and whether the whole weight must be
    a multiple of it (TE allocates whole blocks only; the reference pads the last block)."""
    label: str  # e.g. "MXFP8 (32-element blocks)"
    rows: int
    cols: int
    whole: bool = False


def cut_problem(w: Weight, mesh: MeshSpec, b: Blocks) -> str | None:
    """How ``mesh`` cuts ``w`` inside its blocks ("64 rows per FSDP2 shard cut its 128-row
    blocks"), or None."""
    if b.whole and (w.rows % b.rows or w.cols % b.cols):
        return f"[{w.rows} x {w.cols}] is not a whole number of {b.rows} x {b.cols} blocks"
    rows, cols = w.local(mesh)
    if rows != w.rows and rows % b.rows:
        return f"{rows} rows per TP shard cut its {b.rows}-row blocks"
    if cols != w.cols and cols % b.cols:
        return f"{cols} columns per TP shard cut its {b.cols}-column blocks"
    if mesh.shard > 1:
        per = -(-rows // mesh.shard)
        if per < rows and per % b.rows:
            return f"{per} rows per FSDP2 shard cut its {b.rows}-row blocks"
    return None


def uneven_problem(w: Weight, mesh: MeshSpec) -> str | None:
    """Where FSDP2 would shard ``w``'s TP-local rows unevenly over ``mesh`` ("30 rows over 4
    FSDP2 shards"), or None. FSDP2 pads such shards (``ceil(rows / shards)`` rows each), and an
    all-gather extension must return the padded size there (torch's ``fsdp_pre_all_gather``
    contract, pytorch/pytorch#137005) -- TE's quantized tensors (and the reference's, which
    follow them) return the unpadded shard: the padded ranks assert, the others wait in the
    all-gather until the collective timeout."""
    rows = w.local(mesh)[0]
    if mesh.shard > 1 and rows % mesh.shard:
        return f"{rows} rows over {mesh.shard} FSDP2 shards"
    return None


def gathers_quantized(case, off_axis: str) -> bool:
    """Whether FSDP2 all-gathers ``case``'s weights quantized: a quantized recipe whose
    all-gather hooks its ``off_axis`` (the reference's ``fixes``, TE's ``mutation``) leaves on."""
    return case.recipe in catalog.QUANTIZED_RECIPES and \
        case.ax.get(off_axis) != "no_quantized_allgather"


def gemm_problem(case, mesh: MeshSpec, weights: list[Weight], align: int) -> str | None:
    """What of ``case``'s GEMMs on ``mesh`` is not a multiple of ``align`` elements: the tokens a
    rank multiplies (its slice of the batch x seq; TP ranks share it) or a weight's TP-local
    dims ("72 tokens per rank (batch 12 / 2 data-parallel ranks x seq 12)"), or None."""
    d = case.model
    tokens = d.batch // mesh.dp_size * d.seq
    if tokens % align:
        return (f"{tokens} tokens per rank (batch {d.batch} / {mesh.dp_size} data-parallel "
                f"ranks x seq {d.seq})")
    for w in weights:
        rows, cols = w.local(mesh)
        if rows % align or cols % align:
            return f"weight {w.name} [{rows} x {cols}] per TP rank"
    return None


def skip_reason(case, weights: list[Weight], blocks: Blocks | None,
                quantized_gather: bool = False, gemm_align: int | None = None) -> str | None:
    """The first weight of ``case`` its mesh (or reshard target) cannot shard, as a skip
    reason: a cut inside a block (``blocks``), or -- where the weights are all-gathered
    quantized (``quantized_gather``) -- an uneven FSDP2 shard; or, where the library's
    quantized GEMMs need dims that are multiples of ``gemm_align``, a GEMM that is not; None
    when none of these happens."""
    meshes = [(case.mesh, "mesh")] + ([(case.target, "reshard target")] if case.target else [])
    for mesh, role in meshes if blocks else ():
        for w in weights:
            why = cut_problem(w, mesh, blocks)
            if why:
                return (f"{blocks.label}: weight {w.name} [{w.rows} x {w.cols}] on {role} "
                        f"{mesh.name}: {why}; shards must be whole blocks (model dims that are "
                        f"multiples of shards x block size)")
    for mesh, role in meshes if quantized_gather else ():
        for w in weights:
            why = uneven_problem(w, mesh)
            if why:
                return (f"{case.recipe} all-gathered quantized: weight {w.name} [{w.rows} x "
                        f"{w.cols}] on {role} {mesh.name}: {why} are uneven; TE's "
                        f"fsdp_pre_all_gather returns the unpadded shard, so FSDP2 asserts on "
                        f"the padded ranks and the others wait out the collective timeout "
                        f"(model dims that are multiples of the shards)")
    for mesh, role in meshes if gemm_align else ():
        why = gemm_problem(case, mesh, weights, gemm_align)
        if why:
            return (f"{case.recipe} GEMMs need dims that are multiples of {gemm_align} (TE's "
                    f"cuBLASLt call asserts 'Leading dimension requirement ... Caller must "
                    f"pad'): on {role} {mesh.name}, {why}")
    return None


# --- reference backend: its modules' GEMM weights, its codecs' block factors --------------
def reference_weights(module: str, dims) -> list[Weight]:
    """The quantized (GEMM) weights of a reference module, as ``modules.py`` declares them."""
    from harness.reference import build as ref
    layer = [("self_attention.", ref.MultiheadAttention), ("layernorm_mlp.", ref.LayerNormMLP)]
    if module == "LlamaStack":  # every layer alike; the embedding and tied head stay unquantized
        parts = [(f"layers.0.{p}", cls) for p, cls in layer]
    else:
        parts = layer if module == "TransformerLayer" else [("", ref.MODULES[module])]
    out = []
    for prefix, cls in parts:
        for w_name, _ in cls.GEMMS.values():
            _, kind, shape = cls.PARAMS[w_name]
            rows, cols = shape(dims)
            out.append(Weight(prefix + w_name, rows, cols, kind))
    return out


def reference_blocks(recipe: str) -> Blocks | None:
    """Block sizes of the reference weight codec of ``recipe`` (lcm of its parts' factors)."""
    from harness.reference.quantizers import WEIGHT_CODEC
    codec = WEIGHT_CODEC.get(recipe)
    if codec is None:
        return None
    factors = [f for f in codec.factors.values() if f is not None]
    rows, cols = (math.lcm(*(f[d] for f in factors)) for d in (0, 1))
    if rows == cols == 1:
        return None
    return Blocks(f"{recipe} ({rows} x {cols} weight blocks)", rows, cols)


# --- te backend: TE's modules and documented block requirements (conservative) ------------
#: TE weights per module (as built in te_backend.make: fused QKV, input layernorm)
TE_WEIGHTS = {
    "Linear": lambda d: [Weight("weight", d.out_features, d.hidden, "column")],
    "LayerNormLinear": lambda d: [Weight("weight", d.out_features, d.hidden, "column")],
    "LayerNormMLP": lambda d: [Weight("fc1_weight", d.ffn, d.hidden, "column"),
                               Weight("fc2_weight", d.hidden, d.ffn, "row")],
    "MultiheadAttention": lambda d: [Weight("layernorm_qkv.weight", 3 * d.hidden, d.hidden,
                                            "column"),
                                     Weight("proj.weight", d.hidden, d.hidden, "row")],
}
TE_WEIGHTS["TransformerLayer"] = lambda d: (
    [Weight("self_attention." + w.name, w.rows, w.cols, w.tp)
     for w in TE_WEIGHTS["MultiheadAttention"](d)]
    + [Weight("layernorm_mlp." + w.name, w.rows, w.cols, w.tp)
       for w in TE_WEIGHTS["LayerNormMLP"](d)])
TE_WEIGHTS["LlamaStack"] = lambda d: [  # every layer alike; embedding and tied head unquantized
    Weight("layers.0." + w.name, w.rows, w.cols, w.tp) for w in TE_WEIGHTS["TransformerLayer"](d)]
#: Float8BlockwiseQTensor: 128x128 weight blocks, FSDP2 shards in whole blocks of 128 rows;
#: MXFP8Tensor: dims divisible by 32 (make_empty asserts it; a split that is not a multiple of
#: 32 rows falls back to a high-precision all-gather); NVFP4: 16-element blocks, the same way.
#: TE's quantized GEMMs: every leading dimension a multiple of 16 elements (cublaslt_gemm.cu
#: CanonicalizeGemmInput asserts ``lda % 16 == 0`` for FP8; what was seen: docs/scenarios.md).
#: The MXFP8 / NVFP4 block formats may need more (unmeasured); their weights' blocks are
#: TE_BLOCKS'.
TE_GEMM_ALIGN = dict.fromkeys(catalog.QUANTIZED_RECIPES, 16)
TE_BLOCKS = {"block": Blocks("Float8BlockScaling (128 x 128 weight blocks)", 128, 128, True),
             "mxfp8": Blocks("MXFP8BlockScaling (32-element blocks)", 32, 32, True),
             "nvfp4": Blocks("NVFP4BlockScaling (16-element blocks)", 16, 16, True)}


def te_weights(module: str, dims) -> list[Weight]:
    return TE_WEIGHTS[module](dims)
