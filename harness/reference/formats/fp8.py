"""Per-tensor FP8 (E4M3 / E5M2) reference quantization.

Formats (OCP 8-bit floating point, as implemented by ``torch.float8_e4m3fn`` and
``torch.float8_e5m2``):

* **E4M3** ("fn" variant): 1 sign, 4 exponent (bias 7), 3 mantissa bits. No
  infinities; only ``S.1111.111`` is NaN, so the largest finite value is
  ``1.75 * 2**8 = 448``. Machine epsilon ``2**-3``.
* **E5M2**: 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-like with
  ±inf and NaNs; largest finite value ``1.75 * 2**15 = 57344``. Epsilon ``2**-2``.

Per-tensor scaling (TE ``DelayedScaling`` / ``Float8CurrentScaling``): one fp32
``scale`` per tensor, ``q = cast(x * scale)`` and ``x ~= q * scale_inv`` with
``scale_inv = 1 / scale``. The scale maps the tensor's absolute maximum onto the
format maximum: ``scale = fmt.max / amax / 2**margin``.

Casting is *saturating*: finite values and ±inf beyond ``±fmt.max`` become
``±fmt.max`` and NaN stays NaN. Rounding is round-to-nearest-even (torch's cast).
All quantized data is returned as ``torch.uint8`` bit patterns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

__all__ = [
    "FP8Format", "E4M3", "E5M2", "FORMATS", "amax", "scale_from_amax",
    "saturating_cast", "quantize", "dequantize", "DelayedScaling", "current_scale",
]


@dataclass(frozen=True)
class FP8Format:
    """An FP8 element format: torch dtype, largest finite value and epsilon."""

    name: str
    torch_dtype: torch.dtype
    max: float
    eps: float  # machine epsilon = 2**-mantissa_bits


E4M3 = FP8Format("e4m3", torch.float8_e4m3fn, 448.0, 2.0**-3)
E5M2 = FP8Format("e5m2", torch.float8_e5m2, 57344.0, 2.0**-2)
FORMATS = {"e4m3": E4M3, "e5m2": E5M2}

_F32_MAX = torch.finfo(torch.float32).max


def amax(x: torch.Tensor) -> torch.Tensor:
    """Absolute maximum of ``x`` as an fp32 scalar on ``x``'s device (0 if empty).

    NaN anywhere in ``x`` gives a NaN amax (``scale_from_amax`` then falls back to 1).
    """
    x = x.detach()
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    return x.abs().amax().to(torch.float32)


def scale_from_amax(amax: torch.Tensor, fmt: FP8Format = E4M3, margin: int = 0) -> torch.Tensor:
    """``fmt.max / amax / 2**margin`` as fp32 (elementwise, any shape).

    Conventions: ``amax == 0`` or non-finite amax -> scale 1.0 (TE keeps the
    previous scale instead; starting from 1.0 that is the same on first use). A
    scale that overflows fp32 (tiny amax) is clamped to the fp32 maximum, so the
    result is always finite and positive.
    """
    amax = torch.as_tensor(amax, dtype=torch.float32)
    scale = fmt.max / amax / (2.0 ** margin)
    ok = (amax > 0) & torch.isfinite(amax)
    scale = torch.where(ok, scale, torch.ones_like(scale))
    return torch.clamp(scale, max=_F32_MAX)


def saturating_cast(x_f32: torch.Tensor, fmt: FP8Format) -> torch.Tensor:
    """Round fp32 values to ``fmt`` (RNE) with saturation; returns uint8 bit patterns.

    torch's plain cast turns out-of-range values into NaN (E4M3) or inf (E5M2);
    clamping first gives the saturating behaviour. ``clamp`` keeps NaN as NaN.
    """
    y = torch.clamp(x_f32.to(torch.float32), -fmt.max, fmt.max)
    return y.to(fmt.torch_dtype).view(torch.uint8)


def quantize(x: torch.Tensor, scale: torch.Tensor, fmt: FP8Format = E4M3) -> torch.Tensor:
    """Saturating cast of ``x * scale`` (fp32 math) to ``fmt``; uint8 of ``x.shape``."""
    scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    return saturating_cast(x.to(torch.float32) * scale, fmt)


def dequantize(data_u8: torch.Tensor, scale_inv: torch.Tensor, fmt: FP8Format = E4M3,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``decode(data_u8) * scale_inv`` computed in fp32, returned as ``dtype``."""
    scale_inv = torch.as_tensor(scale_inv, dtype=torch.float32, device=data_u8.device)
    vals = data_u8.view(fmt.torch_dtype).to(torch.float32)
    return (vals * scale_inv).to(dtype)


class DelayedScaling:
    """Delayed (history-based) per-tensor scaling state, like TE's ``DelayedScaling``.

    Convention (matches TE): a step's forward quantizes with the *current*
    ``scale`` (computed from earlier steps), the tensor's amax is then recorded
    with :meth:`record`, and :meth:`update` is called after the step to derive
    the scale used by the next step. ``amax_history[0]`` is the newest entry;
    ``record`` rolls the history by one, dropping the oldest entry.

    ``algo="max"`` uses the max over the whole history, ``"most_recent"`` uses
    ``amax_history[0]``. ``scale``/``scale_inv`` start at 1.0; a zero/non-finite
    history amax gives scale 1.0 (see :func:`scale_from_amax`).
    """

    def __init__(self, history_len: int = 16, algo: str = "max", margin: int = 0,
                 fmt: FP8Format = E4M3, device=None):
        if history_len < 1:
            raise ValueError(f"history_len must be >= 1, got {history_len}")
        if algo not in ("max", "most_recent"):
            raise ValueError(f"algo must be 'max' or 'most_recent', got {algo!r}")
        self.history_len = history_len
        self.algo = algo
        self.margin = margin
        self.fmt = fmt
        self.amax_history = torch.zeros(history_len, dtype=torch.float32, device=device)
        self.scale = torch.ones((), dtype=torch.float32, device=device)
        self.scale_inv = torch.ones((), dtype=torch.float32, device=device)

    def record(self, amax: torch.Tensor) -> None:
        """Push a new amax: history rolls by one, newest stored at index 0."""
        amax = torch.as_tensor(amax, dtype=torch.float32, device=self.amax_history.device)
        self.amax_history = torch.roll(self.amax_history, 1)
        self.amax_history[0] = amax.reshape(())

    def update(self) -> None:
        """Recompute ``scale`` and ``scale_inv`` from the history."""
        if self.algo == "max":
            a = self.amax_history.amax()
        else:
            a = self.amax_history[0]
        self.scale = scale_from_amax(a, self.fmt, self.margin)
        self.scale_inv = 1.0 / self.scale


def current_scale(x: torch.Tensor, fmt: FP8Format = E4M3, margin: int = 0,
                  reduce_amax: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
    """Current (just-in-time) scaling: ``(scale, scale_inv)`` from ``x``'s own amax.

    ``reduce_amax``, if given, maps the local amax to the group amax (e.g. an
    all-reduce MAX over the shard group) so that all shards of a sharded tensor
    share one scale, identical to quantizing the unsharded tensor. A callable
    that reduces in place and returns something other than a tensor (e.g.
    ``lambda a: dist.all_reduce(a, op=dist.ReduceOp.MAX)``) is accepted too.
    """
    a = amax(x)
    if reduce_amax is not None:
        reduced = reduce_amax(a)
        if isinstance(reduced, torch.Tensor):
            a = reduced
    scale = scale_from_amax(a, fmt, margin)
    return scale, 1.0 / scale
