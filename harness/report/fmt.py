"""How numbers, durations and dates read in the report (the templates' filters)."""

from __future__ import annotations

import math

import pandas as pd


def num(x) -> str:
    """3 significant digits; NaN -> '–', inf -> '∞'; anything else as text."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(x):
        return "–"
    if math.isinf(x):
        return "∞"
    if x == 0:
        return "0"
    return f"{x:.3g}"


def secs(x) -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "–"
    return "–" if math.isnan(x) else f"{x:.1f} s"


def date(s) -> str:
    """ISO date -> 'YYYY-MM-DD HH:MM UTC' (as is when it does not parse)."""
    try:
        ts = pd.Timestamp(s)
    except (TypeError, ValueError):
        return str(s)
    if ts is pd.NaT:
        return str(s)
    ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
    return ts.strftime("%Y-%m-%d %H:%M UTC")


def share(part, whole) -> float | None:
    """part / whole in percent, None when either is missing or whole is 0."""
    try:
        part, whole = float(part), float(whole)
    except (TypeError, ValueError):
        return None
    if not whole or math.isnan(whole) or math.isnan(part):
        return None
    return 100 * part / whole


FILTERS = {"num": num, "secs": secs, "date": date}
