"""Compare two flat {name: tensor} states: max-abs, relative L2 and the first differing index.

Used by every numeric check. ``bitwise`` compares bit patterns (so -0.0 != 0.0); otherwise
values are compared in float64. A non-finite value (NaN, +-inf) on either side is a failure of
its own, whatever the tolerance -- two runs that both diverge do not agree -- unless the
tolerance says why it allows them (``Tolerance.nonfinite``). The raw storage of a quantized
tensor (``<name>#<buffer>`` keys other than ``#dequantized``: data, scales, transposes) is
compared byte for byte only: it holds encoded values and padding (TE pads block scales with
whatever memory held), so the non-finite rule applies to its decoded values instead.
On ranks other than 0 the whole tensors of a gather are placeholders (``distributed/gather.py``):
their keys, shapes and dtypes are compared, their values only on rank 0.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from harness.calibration.tolerances import Tolerance, tol_text
from harness.speed import layers


@dataclass
class Comparison:
    max_abs: float
    rel_l2: float
    n_diff: int  # elements whose bits differ
    n_total: int
    first_diff: str | None  # e.g. "model.fc1.weight[3, 5]: 0.125 vs 0.1251"
    problems: list[str]  # missing / extra keys, shape or dtype mismatches

    nonfinite: list[str] = None  # "key: N NaN / M inf (actual|expected), first at [i]"

    def fails_anyway(self, tol: Tolerance) -> bool:
        """Failed whatever its tolerance: keys, shapes or dtypes differ, or a value is NaN /
        inf where the tolerance gives no reason to allow it."""
        return bool(self.problems or (self.nonfinite and not tol.nonfinite))

    def passes(self, tol: Tolerance) -> bool:
        if self.fails_anyway(tol):
            return False
        if tol.bitwise:
            return self.n_diff == 0
        return self.max_abs <= tol.max_abs and self.rel_l2 <= tol.rel_l2

    def describe(self, tol: Tolerance) -> str:
        s = (f"max_abs={self.max_abs:.3g} ({tol_text(tol.max_abs)}), rel_l2={self.rel_l2:.3g} "
             f"({tol_text(tol.rel_l2)}), {self.n_diff}/{self.n_total} elements differ")
        if tol.source and not tol.bitwise:
            s += f" [tolerance: {tol.source}]"
        if self.first_diff:
            s += f"; first: {self.first_diff}"
        if self.nonfinite:
            s += "; non-finite: " + "; ".join(self.nonfinite[:5])
        if self.problems:
            s += "; " + "; ".join(self.problems[:5])
        return s

    def to_dict(self):
        return asdict(self)


def _index(flat_i: int, shape) -> str:
    if not shape:
        return ""
    idx = []
    for size in reversed(shape):
        idx.append(flat_i % size)
        flat_i //= size
    return "[" + ", ".join(map(str, reversed(idx))) + "]"


def _raw_storage(key: str) -> bool:
    """A quantized tensor's raw buffer (``x#data``, ``x#local.rowwise_scale_inv``), not a value
    (``x#dequantized``, TE's decoded ``_extra_state#...`` entries)."""
    _, sep, part = key.partition("#")
    return bool(sep) and part != "dequantized" and not key.partition("#")[0].endswith(
        "_extra_state") and not part.startswith("replicas_diverge")


def _nonfinite(key: str, side: str, t: torch.Tensor) -> str | None:
    bad = ~torch.isfinite(t)
    if not bool(bad.any()):
        return None
    i = int(bad.nonzero()[0])
    return (f"{key} ({side}): {int(t.isnan().sum())} NaN / {int(t.isinf().sum())} inf, "
            f"first at flat index {i}")


def _where(a: torch.Tensor, e: torch.Tensor) -> torch.device:
    """Compare where the data is: on the GPU when either side is there (no float64 copies on
    the host, one synchronization per comparison), else on the CPU."""
    for t in (a, e):
        if t.device.type == "cuda":
            return t.device
    return torch.device("cpu")


def _on_device(a: torch.Tensor, e: torch.Tensor):
    """Both sides on the comparison's device, and their float64 flat views."""
    dev = _where(a, e)
    a, e = a.detach().to(dev), e.detach().to(dev)
    return a, e, a.to(torch.float64).flatten(), e.to(torch.float64).flatten()


def _differs(a, e, a64, e64) -> torch.Tensor:
    """Per element (flat): the bits differ (one dtype; compared as integers of the element's
    width where there is one, else byte by byte), or the values do (two dtypes; NaN = NaN)."""
    if a.dtype == e.dtype:
        ints = _SAME_SIZE_INT.get(e.element_size())
        if ints is not None:
            return a.detach().reshape(-1).view(ints) != e.detach().reshape(-1).view(ints)
        ab, eb = bits(a).reshape(a64.numel(), -1), bits(e).reshape(e64.numel(), -1)
        return (ab != eb).any(dim=1)
    return ~((a64 == e64) | (a64.isnan() & e64.isnan()))


def _stats(k: str, a: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Per-key statistics, a float64 tensor on the comparison's device: elements that differ,
    sum of squared finite reference values, whether a value on either side is non-finite,
    max-abs and sum of squared finite differences. On a GPU the last two are NaN (filled in
    by :func:`_diff_stats` for the keys that differ: asking whether any differ would be a
    host sync per key); on the CPU they are measured here, once."""
    if _where(a, e).type == "cpu" and a.dtype == e.dtype and layers.active("compare_fast_path"):
        fast = _equal_stats(a, e)
        if fast is None:
            fast = _finite_stats(a, e)
        if fast is not None:
            return fast
    a, e, a64, e64 = _on_device(a, e)
    differs = _differs(a, e, a64, e64)
    fin_e = torch.isfinite(e).reshape(-1)  # on the narrow dtype: converting keeps finiteness
    check_nf = (a.is_floating_point() or e.is_floating_point()) and not _raw_storage(k)
    nonfin = (~(torch.isfinite(a).all() & fin_e.all())) if check_nf else differs.new_zeros(())
    if a64.device.type != "cpu":
        sizes = torch.full((2,), math.nan, dtype=torch.float64, device=a64.device)
    elif bool(differs.any()):
        sizes = _diff_from(a64, e64, differs)
    else:
        sizes = torch.zeros(2, dtype=torch.float64)
    return torch.cat([torch.stack([differs.sum().to(torch.float64),
                                   torch.where(fin_e, e64, torch.zeros_like(e64)).square().sum(),
                                   nonfin.to(torch.float64)]), sizes])


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _equal_stats(a: torch.Tensor, e: torch.Tensor) -> torch.Tensor | None:
    """:func:`_stats` of two CPU tensors of one dtype that hold the same bits and only finite
    values -- most keys of most checks -- from one comparison of their bits (as integers of the
    same width) and one float64 dot product of ``e`` with itself, whose being finite also says
    that every value is (a fast path); None for any other pair (it takes the
    general path)."""
    a, e = a.detach(), e.detach()
    ints = _SAME_SIZE_INT.get(e.element_size())
    if not (torch.equal(a.view(ints), e.view(ints)) if ints else torch.equal(bits(a), bits(e))):
        return None
    d = e.reshape(-1).to(torch.float64)
    sq = torch.dot(d, d)
    if not bool(torch.isfinite(sq)):  # a NaN / inf (or a float64 overflow): the general path
        return None
    out = torch.zeros(5, dtype=torch.float64)
    out[1] = sq
    return out


def _finite_stats(a: torch.Tensor, e: torch.Tensor) -> torch.Tensor | None:
    """:func:`_stats` of two CPU tensors of one dtype whose bits differ and whose values are
    all finite -- what a parity check compares -- without the masks of the general path: where
    the bits are equal the difference is 0, so max-abs and the squared sum of the differences
    over all elements are those over the differing ones; a non-finite value on either side
    makes a sum non-finite and takes the general path (None), as does a dtype without an
    integer of its width (a fast path)."""
    ints = _SAME_SIZE_INT.get(e.element_size())
    if ints is None or a.dtype == torch.bool:
        return None
    a, e = a.detach().reshape(-1), e.detach().reshape(-1)
    a64, e64 = a.to(torch.float64), e.to(torch.float64)
    n_diff = torch.count_nonzero(_differs(a, e, a64, e64)).to(torch.float64)
    d = a64 - e64
    sq_ref, sq_diff = torch.dot(e64, e64), torch.dot(d, d)
    if not bool(torch.isfinite(sq_ref) & torch.isfinite(sq_diff)):
        return None
    return torch.stack([n_diff, sq_ref, torch.zeros((), dtype=torch.float64),
                        d.abs().max(), sq_diff])


def _diff_from(a64, e64, differs) -> torch.Tensor:
    """Max-abs (a NaN on one side only counts as inf) and the sum of squared finite
    differences, over the elements that differ."""
    diff = (a64 - e64).abs()
    diff = torch.where(a64.isnan() & e64.isnan(), torch.zeros_like(diff), diff)
    diff = torch.where(diff.isnan(), torch.full_like(diff, math.inf), diff)
    diff = torch.where(differs, diff, torch.zeros_like(diff))
    return torch.stack([diff.max(),
                        torch.where(torch.isfinite(diff), diff, torch.zeros_like(diff))
                        .square().sum()])


def _diff_stats(a: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    a, e, a64, e64 = _on_device(a, e)
    return _diff_from(a64, e64, _differs(a, e, a64, e64))


def _fetch(stats: list[torch.Tensor]) -> list[list[float]]:
    """Every key's statistics to the host, one synchronization per device."""
    by_dev: dict = {}
    for i, t in enumerate(stats):
        by_dev.setdefault(t.device, []).append(i)
    out: list = [None] * len(stats)
    for idx in by_dev.values():
        for i, row in zip(idx, torch.stack([stats[i] for i in idx]).cpu().tolist()):
            out[i] = row
    return out


def _first(k: str, a: torch.Tensor, e: torch.Tensor) -> str:
    """The first differing element: ``key[index]: actual vs expected``."""
    a2, e2, fa, fe = _on_device(a, e)
    i = int(_differs(a2, e2, fa, fe).nonzero()[0])
    return f"{k}{_index(i, tuple(a.shape))}: {fa[i].item():.9g} vs {fe[i].item():.9g}"


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bits, flat: two tensors of one dtype and shape are bit-equal where these are
    (NaN payloads compare, -0.0 differs from 0.0)."""
    t = t.contiguous().reshape(-1)
    return t if t.dtype == torch.bool else t.view(torch.uint8)


def compare(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> Comparison:
    problems, max_abs, n_diff, n_total, nonfinite = [], 0.0, 0, 0, []
    sq_diff = sq_ref = 0.0
    first = None
    for k in sorted(set(expected) - set(actual)):
        problems.append(f"missing {k}")
    for k in sorted(set(actual) - set(expected)):
        problems.append(f"unexpected {k}")
    keyed = []  # (key, stats) of the tensor pairs to measure
    for k in sorted(set(actual) & set(expected)):
        a, e = actual[k], expected[k]
        if not isinstance(a, torch.Tensor) or not isinstance(e, torch.Tensor):
            if a != e:
                problems.append(f"{k}: {a!r} != {e!r}")
            continue
        if a.shape != e.shape:
            problems.append(f"{k}: shape {tuple(a.shape)} != {tuple(e.shape)}")
            continue
        if a.dtype != e.dtype:
            problems.append(f"{k}: dtype {a.dtype} != {e.dtype}")
        if a.is_meta or e.is_meta:  # a whole tensor rank 0 holds and compares (gather.py)
            continue
        n_total += a.numel()
        if a.numel() == 0:  # e.g. TE's empty _extra_state
            continue
        keyed.append((k, _stats(k, a, e)))
    values = _fetch([st for _, st in keyed])  # one host sync per device for all keys
    later = [k for (k, _), v in zip(keyed, values) if v[0] and math.isnan(v[3])]
    sizes = dict(zip(later, _fetch([_diff_stats(actual[k], expected[k])
                                    for k in later])))  # GPU keys that differ: one more sync
    for (k, _), (nd, sqr, nf, mx, sqd) in zip(keyed, values):
        sq_ref += sqr
        if nf:  # rare: the details, recomputed for this key only
            _, _, a64, e64 = _on_device(actual[k], expected[k])
            nonfinite += [m for m in (_nonfinite(k, "actual", a64), _nonfinite(k, "expected", e64))
                          if m]
        if nd:
            mx, sqd = sizes.get(k, (mx, sqd))
            n_diff += int(nd)
            max_abs = max(max_abs, mx)
            sq_diff += sqd
            if first is None:
                first = _first(k, actual[k], expected[k])
    if max_abs == math.inf:
        rel = math.inf
    else:
        rel = math.sqrt(sq_diff) / math.sqrt(sq_ref) if sq_ref > 0 else (0.0 if sq_diff == 0 else math.inf)
    return Comparison(max_abs=max_abs, rel_l2=rel, n_diff=n_diff, n_total=n_total,
                      first_diff=first, problems=problems, nonfinite=nonfinite)
