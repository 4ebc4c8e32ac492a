"""How each quantized format lays out its raw parts, and how it (de)quantizes a 2-D tensor.

A QuantizedTensor of logical shape [M, N] holds named *parts*: uint8 data and scales. Every
part is laid out like the logical tensor, coarsened by a block factor per dim: a part with
factors (f0, f1) has shape [ceil(M/f0), ceil(N/f1)]; factor None means a scalar shared by the
whole tensor (a per-tensor scale). That one rule lets slicing, FSDP2 sharding, gathering and
DCP chunk assembly work the same way for every format.

    fp8     data (1,1), scale_inv scalar                          delayed / current scaling
    block   data (1,1), scale_inv (128,128)                       FP8 block scaling (weights)
    mxfp8   row_data (1,1), row_scale (1,32), col_data (1,1), col_scale (32,1)   E8M0 scales
    nvfp4   row_data (1,2), row_scale (1,16), col_data (2,1), col_scale (16,1), s_enc scalar

"row" parts serve GEMMs that contract over the last dim (forward: x @ W^T), "col" parts those
contracting over dim 0 (dgrad: g @ W). For fp8 and block one data serves both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.reference.formats import block as blockfmt
from harness.reference.formats import fp8, mxfp8, nvfp4

# MXFP8 shared exponents rounded up (amax / 448, TE's choice): no element saturates. The OCP
# spec's floor(log2(amax)) - 8 can clip a block's largest elements by up to 12.5%.
MX_ROUNDING = "ceil"


class QuantizedLayoutError(ValueError):
    """A slice / shard boundary falls inside a block of a blocked format."""


@dataclass(frozen=True)
class Codec:
    name: str
    factors: dict  # part -> (f0, f1) or None (shared scalar)
    usage_parts: dict  # usage ("row" / "col") -> parts it needs
    dtypes: dict  # part -> torch dtype

    def __deepcopy__(self, memo):  # codecs are constants (DCP staging deep-copies __dict__)
        return self

    def part_shape(self, part: str, shape) -> tuple:
        f = self.factors[part]
        if f is None:
            return ()
        return tuple(-(-s // k) for s, k in zip(shape, f))

    def parts_for(self, usages) -> tuple[str, ...]:
        names = []
        for u in ("row", "col"):
            if u in usages:
                names += [p for p in self.usage_parts[u] if p not in names]
        return tuple(names) + tuple(p for p, f in self.factors.items() if f is None and p not in names)

    def slice_part(self, part: str, t: torch.Tensor, dim: int, start: int, end: int, size: int):
        f = self.factors[part]
        if f is None:
            return t
        k = f[dim]
        if start % k or (end % k and end != size):
            raise QuantizedLayoutError(
                f"{self.name}: part '{part}' has blocks of {k} along dim {dim}; cannot cut "
                f"[{start}:{end}] of {size} (FSDP2 / TP shards of blocked formats must start on "
                f"block boundaries: make the dim a multiple of shards x {k})")
        return t.narrow(dim, start // k, -(-end // k) - start // k)

    # --- numerics ------------------------------------------------------------------------
    def quantize(self, x2d: torch.Tensor, usages, q: dict) -> dict:
        """Parts of ``x2d`` (fp32). ``q``: scale (fp8), global_amax (nvfp4)."""
        x = x2d.to(torch.float32)
        if self.name == "fp8":  # weights are E4M3
            return {"data": fp8.quantize(x, q["scale"], fp8.E4M3),
                    "scale_inv": (1.0 / q["scale"]).reshape(()).to(torch.float32)}
        if self.name == "block":
            data, s = blockfmt.quantize_blockwise(x, (128, 128), fp8.E4M3, power_of_2_scales=True)
            return {"data": data, "scale_inv": s}
        out = {}
        if self.name == "mxfp8":
            if "row" in usages:
                out["row_data"], out["row_scale"] = mxfp8.quantize_mxfp8(x, axis=-1, scale_rounding=MX_ROUNDING)
            if "col" in usages:
                out["col_data"], out["col_scale"] = mxfp8.quantize_mxfp8(x, axis=0, scale_rounding=MX_ROUNDING)
            return out
        if self.name == "nvfp4":
            g = q["global_amax"]
            for usage, axis in (("row", -1), ("col", 0)):
                if usage in usages:
                    d, s, s_enc = nvfp4.quantize_nvfp4(x, global_amax=g, axis=axis)
                    out[f"{usage}_data"], out[f"{usage}_scale"], out["s_enc"] = d, s, s_enc
            return out
        raise ValueError(self.name)

    def dequantize(self, parts: dict, shape, usage: str = "row") -> torch.Tensor:
        if self.name == "fp8":
            return fp8.dequantize(parts["data"], parts["scale_inv"], fp8.E4M3).reshape(shape)
        if self.name == "block":
            return blockfmt.dequantize_blockwise(parts["data"], parts["scale_inv"], (128, 128)).reshape(shape)
        if usage not in self.available(parts):
            raise RuntimeError(f"{self.name} tensor has no {usage}wise data (has "
                               f"{sorted(self.available(parts))}): the all-gather or "
                               f"quantization skipped the usage this GEMM needs")
        if self.name == "mxfp8":
            return mxfp8.dequantize_mxfp8(parts[f"{usage}_data"], parts[f"{usage}_scale"],
                                          axis=-1 if usage == "row" else 0).reshape(shape)
        if self.name == "nvfp4":
            return nvfp4.dequantize_nvfp4(parts[f"{usage}_data"], parts[f"{usage}_scale"],
                                          parts["s_enc"], shape, axis=-1 if usage == "row" else 0)
        raise ValueError(self.name)

    def available(self, parts: dict) -> set:
        return {u for u, names in self.usage_parts.items() if all(p in parts for p in names)}


U8, F32 = torch.uint8, torch.float32
FP8 = Codec("fp8", {"data": (1, 1), "scale_inv": None}, {"row": ("data",), "col": ("data",)},
            {"data": U8, "scale_inv": F32})
BLOCK = Codec("block", {"data": (1, 1), "scale_inv": (128, 128)},
              {"row": ("data", "scale_inv"), "col": ("data", "scale_inv")},
              {"data": U8, "scale_inv": F32})
MXFP8 = Codec("mxfp8", {"row_data": (1, 1), "row_scale": (1, 32), "col_data": (1, 1),
                        "col_scale": (32, 1)},
              {"row": ("row_data", "row_scale"), "col": ("col_data", "col_scale")},
              {"row_data": U8, "row_scale": U8, "col_data": U8, "col_scale": U8})
NVFP4 = Codec("nvfp4", {"row_data": (1, 2), "row_scale": (1, 16), "col_data": (2, 1),
                        "col_scale": (16, 1), "s_enc": None},
              {"row": ("row_data", "row_scale"), "col": ("col_data", "col_scale")},
              {"row_data": U8, "row_scale": U8, "col_data": U8, "col_scale": U8, "s_enc": F32})
CODECS = {c.name: c for c in (FP8, BLOCK, MXFP8, NVFP4)}
