"""The outcome matrix (recipe x mesh per module, per group) and the case details it links to.

:func:`matrices` runs first: it registers the anchor of every cell and case, which the other
sections use to link a case to its details.
"""

from __future__ import annotations

import math
from collections import Counter

import pandas as pd

from harness.report.context import Group, ReportContext, axes, coord
from harness.report.outcomes import (
    FAILED_ROWS,
    MEANING,
    SEVERITY,
    SHORT,
    case_rows,
    check_rows,
    outcome,
    worst,
)


def legend() -> list[dict]:
    """The outcomes, worst first, with what each means."""
    return [{"outcome": o, "short": SHORT[o], "meaning": MEANING[o]} for o in SEVERITY]


def matrices(ctx: ReportContext) -> list[dict]:
    """Per group (latest run): one recipe x mesh table per module; cells count their cases."""
    out = []
    for g in ctx.groups:
        run = ctx.run(g.runs[-1])
        cases = case_rows(ctx.rows(g))
        counts = Counter(outcome(o) for o in cases["case_outcome"])
        recipe, mesh, module = (cases[c].map(coord) for c in ("recipe", "mesh", "module"))
        recipes, meshes = list(dict.fromkeys(recipe)), list(dict.fromkeys(mesh))
        tables = []
        for mod in dict.fromkeys(module):
            in_mod = module == mod
            rows = []
            for rec in recipes:
                cells = [_cell(ctx, g, mod, rec, m, cases[in_mod & (recipe == rec) & (mesh == m)])
                         for m in meshes]
                rows.append({"recipe": rec, "cells": cells})
            tables.append({"module": mod, "meshes": meshes, "rows": rows})
        out.append({"label": g.label, "run_id": run["run_id"], "date": run["date"],
                    "n_cases": len(cases),
                    "counts": [(o, counts[o]) for o in reversed(SEVERITY) if counts.get(o)],
                    "tables": tables})
    return out


def _cell(ctx: ReportContext, g: Group, module: str, rec: str, mesh: str,
          sel: pd.DataFrame) -> dict | None:
    if sel.empty:
        return None
    counts = Counter(outcome(o) for o in sel["case_outcome"])
    for c in sel["case_id"]:
        ctx.case_id((g.hw, g.backend, c))
    return {"anchor": ctx.cell_id((g.hw, g.scenario, g.backend, module, rec, mesh)),
            "title": f"{g.label}: {module}, {rec}, {mesh}", "group": g, "cases": sel,
            "outcome": worst(counts),
            "counts": [(counts[o], SHORT[o]) for o in SEVERITY if counts.get(o)],
            "tip": "; ".join(f"{c}: {o}" for c, o in zip(sel["case_id"], sel["case_outcome"]))}


def cells(matrix: list[dict]) -> list[dict]:
    """Every non-empty cell of the matrices, in page order."""
    return [c for grp in matrix for t in grp["tables"] for r in t["rows"] for c in r["cells"]
            if c is not None]


def details(ctx: ReportContext, matrix: list[dict]) -> list[dict]:
    """One block per matrix cell: its cases with failed checks, reasons, traces, repro."""
    out = []
    per_group: dict[tuple, tuple[dict, dict]] = {}
    for cell in cells(matrix):
        g = cell["group"]
        gk = (g.hw, g.scenario, g.backend)
        if gk not in per_group:
            rows = ctx.rows(g)
            per_group[gk] = (_by_case(check_rows(rows)), _by_case(rows[rows["check"] == "trace"]))
        checks, traces = per_group[gk]
        out.append({"anchor": cell["anchor"], "title": cell["title"],
                    "cases": [case(ctx, c, checks.get(c.case_id, []), traces.get(c.case_id, []),
                                   g) for c in cell["cases"].itertuples(index=False)]})
    return out


ROW_COLUMNS = ["phase", "check", "quantity", "metric", "value", "tolerance", "row_outcome",
               "detail"]


def _by_case(rows: pd.DataFrame) -> dict[str, list[dict]]:
    """case_id -> its rows (the columns a details block shows), in history order."""
    out: dict[str, list[dict]] = {}
    for r in rows[["case_id"] + ROW_COLUMNS].to_dict("records"):
        out.setdefault(r.pop("case_id"), []).append(r)
    return out


def _entry(x) -> int | None:
    if x is pd.NA or x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return int(x)


def case(ctx: ReportContext, c, checks: list[dict], traces: list[dict], g: Group) -> dict:
    """One case of a cell (``c``: its case row; ``checks`` / ``traces``: its check and trace
    rows as dicts): everything its details block shows."""
    inner = {k: v for k, v in axes(c.axes).items() if k not in ("recipe", "mesh", "module")}
    per_step: dict[tuple, list] = {}
    for t in traces:
        per_step.setdefault((t["phase"], t["quantity"]), []).append(t["value"])
    return {
        "anchor": ctx.case_id((g.hw, g.backend, c.case_id)), "case_id": c.case_id,
        "outcome": c.case_outcome, "coords": ", ".join(f"{k}={v}" for k, v in inner.items()),
        "duration_s": c.duration_s,
        "status": c.case_status if c.case_status not in ("", "ok") else "",
        "summary": c.detail,
        "failed": [r for r in checks if r["row_outcome"] in FAILED_ROWS],
        "xfail_entry": _entry(c.xfail_entry), "xfail_reason": c.xfail_reason,
        "skip_reason": c.skip_reason,
        "traces": [{"quantity": q, "phase": p or "train", "values": v}
                   for (p, q), v in per_step.items()],
        "repro": c.repro,
        "rows": checks,
    }
