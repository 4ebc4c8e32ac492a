"""Drift figures: one series' value over the runs against its tolerance, as inline SVG.

Matplotlib (Agg canvas, no pyplot state) writes SVG with text kept as text (``svg.fonttype:
none``): sharp at any zoom and smaller than the 96 dpi PNG it replaces. The SVG is cleaned for
inlining in HTML: no XML prolog or metadata, no ids except those the figure references (renamed
with a per-figure prefix, so several figures on one page never share an id), no comments, no
empty groups, no clip paths (the axes limits already hold every point), no fixed size (it scales
with its box, the viewBox keeps the aspect ratio), no whitespace between tags.
"""

from __future__ import annotations

import io
import math
import re

import matplotlib
import numpy as np
import pandas as pd

from harness.report import drift as drift_mod


def drift_svg(series: pd.DataFrame, runs: pd.DataFrame, cfg: drift_mod.DriftConfig,
              id_prefix: str) -> str:
    """The figure of one series (rows of :func:`drift.points`, oldest first) as an <svg>
    whose ids all start with ``id_prefix`` (unique per figure of a page)."""
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "harness",
                                "font.sans-serif": ["DejaVu Sans", "Arial", "Helvetica"]}):
        fig = _figure(series, runs, cfg)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    return inline_svg(buf.getvalue(), id_prefix)


def _figure(series: pd.DataFrame, runs: pd.DataFrame, cfg: drift_mod.DriftConfig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import LogLocator

    fig = Figure(figsize=(6.4, 2.6), dpi=96)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x = np.arange(len(series))
    v = series["value"].to_numpy(dtype=float)
    tol = series["tolerance"].to_numpy(dtype=float)
    floor = drift_mod.ZERO_FLOOR
    y = np.where(v > floor, v, floor)
    edges = np.arange(len(series) + 1) - 0.5
    if np.all(tol > 0):
        ax.stairs(tol, edges, color="#c62828", ls="--", lw=1.1, label="tolerance",
                  baseline=None)
        ax.stairs(cfg.fraction * tol, edges, color="#ef8f00", ls=":", lw=1.3,
                  label=f"{cfg.fraction:g} × tolerance", baseline=None)
    else:
        ax.plot([], [], " ", label="bitwise check (tolerance 0)")
    ax.plot(x, y, marker="o", ms=4, lw=1.3, color="#1f5fa8", label="value", zorder=3)
    zero = v <= floor
    if zero.any():
        ax.scatter(x[zero], y[zero], marker="v", s=30, facecolors="white", edgecolors="#555",
                   zorder=4, label=f"0 (drawn at {floor:g})")
    bad = series["row_outcome"].isin(["fail", "error"]).to_numpy()
    if bad.any():
        ax.scatter(x[bad], y[bad], marker="X", s=50, color="#c62828", zorder=5,
                   label="check failed")
    flag = series["flagged"].to_numpy(dtype=bool)
    if flag.any():
        ax.scatter(x[flag], y[flag], s=120, facecolors="none", edgecolors="#c62828", lw=1.6,
                   zorder=6, label="drift flagged")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, numticks=6))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0), numticks=6))
    dates = runs.set_index("run_index")["date_ts"]
    labels = []
    for ri in series["run_index"]:
        d = dates.get(ri)
        labels.append(d.strftime("%m-%d\n%H:%M") if isinstance(d, pd.Timestamp) and
                      d is not pd.NaT else f"#{ri}")
    step = max(1, math.ceil(len(x) / 7))
    ax.set_xticks(x[::step])
    ax.set_xticklabels(labels[::step], fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlim(-0.5, len(x) - 0.5)
    ax.margins(y=0.15)
    ax.grid(True, which="major", axis="y", color="#ddd", lw=0.6)
    ax.set_ylabel(series["metric"].iloc[0], fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.subplots_adjust(left=0.14, right=0.72, bottom=0.2, top=0.96)  # tight_layout is slow
    return fig


_ID = re.compile(r'\sid="([^"]*)"')
_REF = re.compile(r'(?:xlink:href|href)="#([^"]+)"')


def inline_svg(svg: str, prefix: str) -> str:
    """Matplotlib's SVG document -> one <svg> element fit for inlining (see module doc)."""
    svg = svg[svg.index("<svg"):]
    head_end = svg.index(">")
    svg = re.sub(r'\s(?:width|height)="[^"]*"', "", svg[:head_end]) + svg[head_end:]
    svg = re.sub(r"<metadata>.*?</metadata>|<!--.*?-->", "", svg, flags=re.S)
    svg = re.sub(r"<clipPath\b.*?</clipPath>", "", svg, flags=re.S)
    svg = re.sub(r'\sclip-path="[^"]*"', "", svg)
    used = set(_REF.findall(svg))
    svg = _ID.sub(lambda m: f' id="{prefix}{m.group(1)}"' if m.group(1) in used else "", svg)
    svg = _REF.sub(lambda m: m.group(0).replace(f'"#{m.group(1)}"', f'"#{prefix}{m.group(1)}"'),
                   svg)
    svg = re.sub(r">\s+<", "><", svg)
    svg = _drop_bare_groups(svg)
    svg = re.sub(r"\s*\n\s*", " ", svg)  # path data: one line
    return svg.replace("<defs></defs>", "").strip()


def _drop_bare_groups(svg: str) -> str:
    """Remove <g> wrappers without attributes (and their </g>): they change nothing."""
    out, keep, pos = [], [], 0
    for m in re.finditer(r"<g\b[^>]*>|</g>", svg):
        out.append(svg[pos:m.start()])
        pos = m.end()
        if m.group(0) == "</g>":
            if keep.pop():
                out.append("</g>")
        else:
            keep.append(m.group(0) != "<g>")
            if keep[-1]:
                out.append(m.group(0))
    out.append(svg[pos:])
    return "".join(out)
