"""What every part of scenario parsing shares: the error type, its one-line form (file, field,
what is allowed), name patterns and number checks."""

from __future__ import annotations

import math
import re

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_VALUE = re.compile(r"^[A-Za-z0-9_.]+$")  # axis values appear in ids and file names
TOP_LEVEL = {"name", "description", "models", "axes", "cases", "exclude", "model",
             "model_overrides", "train", "checks", "tolerances", "timeout_s", "marks"}
MAX_TIMEOUT_S = 86400.0  # a day: a larger per-case timeout is a typo, not a case
MAX_STEPS = 10000
# a step's data comes from a generator seeded with seed * DATA_SEED_STRIDE + step
# (distributed/data.py), which must fit torch's int64: the largest seed
DATA_SEED_STRIDE = 1_000_003
SEED_MAX = (2**63 - 1 - MAX_STEPS) // DATA_SEED_STRIDE
# allowed range (inclusive) of each model / train field; lr must also be > 0
FIELD_RANGES = {"hidden": (1, 65536), "ffn": (1, 262144), "heads": (1, 1024), "seq": (1, 65536),
                "batch": (1, 65536), "out_features": (1, 262144), "layers": (1, 1024),
                "vocab": (1, 1 << 24),
                "steps": (1, MAX_STEPS), "lr": (0.0, 10.0), "seed": (0, SEED_MAX)}


class ScenarioError(ValueError):
    """A scenario file that cannot be run as written."""


def _fail(path, where, msg):
    raise ScenarioError(f"{path}: {where}: {msg}")


_EXPONENT = re.compile(r"^([-+]?)(\d*)(?:\.(\d*))?[eE]([-+]?)(\d+)$")


def number_hint(v) -> str:
    """Why YAML did not read ``v`` as the number it looks like (PyYAML follows YAML 1.1), or
    "": ``yes`` / ``no`` are booleans; ``1e-3`` is text (a float needs a dot, an exponent a
    sign: ``1.0e-3``)."""
    if isinstance(v, bool):
        return " (YAML reads yes / no / on / off as booleans)"
    m = _EXPONENT.match(v) if isinstance(v, str) else None
    if m is None or not (m[2] or m[3]):
        return ""
    sign, whole, frac, esign, exp = m.groups()
    return (f" (YAML 1.1 reads {v} as text, not a number: write it with a dot and a signed "
            f"exponent, e.g. {sign}{whole or 0}.{frac or 0}e{esign or '+'}{exp})")


def _check_number(path, where, v, lo=None, hi=None, *, integer=False, above=False):
    """``v`` is an int (or a float unless ``integer``), finite, ``lo <= v <= hi`` (``lo < v``
    when ``above``). Booleans are refused: YAML reads ``yes`` as true, which is an int."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        hint = number_hint(v)
        _fail(path, where, f"must be {'an integer' if integer else 'a number'}, got {v!r}{hint}")
    if integer and not isinstance(v, int):
        _fail(path, where, f"must be an integer, got {v!r}")
    if not math.isfinite(v):
        _fail(path, where, f"must be a finite number, got {v!r}")
    low_ok = lo is None or (v > lo if above else v >= lo)
    if not low_ok or (hi is not None and v > hi):
        bounds = [f"{'>' if above else '>='} {lo:g}"] if lo is not None else []
        bounds += [f"<= {hi if integer else format(hi, 'g')}"] if hi is not None else []
        _fail(path, where, f"must be {' and '.join(bounds)}, got {v!r}")
    return v
