"""The xfail ledger: every registry entry, how often it matched and whether it is stale."""

from __future__ import annotations

import fnmatch
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from harness.report.context import ReportContext, axes
from harness.report.outcomes import case_rows
from harness.verdict import registry as registry_mod
from harness.verdict import registry_file

KNOWN_AXES = {"recipe", "mesh", "module", "dcp", "reshard", "fixes", "fault"}


def _entries(ctx: ReportContext) -> tuple[list, str]:
    """The registry's entries and why there are none (empty when it was read)."""
    path = ctx.registry_path
    if path is None:
        return [], "no registry file given or recorded in the runs"
    if not Path(path).is_file():
        return [], f"registry {path} not found"
    known = set(KNOWN_AXES)
    for a in case_rows(ctx.h.rows)["axes"].unique():
        known |= set(axes(a))
    try:
        return registry_file.load(path, known).entries, ""
    except registry_mod.RegistryError as e:
        return [], f"cannot read the registry: {e}"


def _by_entry(cases: pd.DataFrame) -> pd.DataFrame:
    """One row per (case, xfail entry that applied to it): since exact xfail semantics a case
    may have several entries (``xfail_entries``, comma-separated)."""
    cases = cases.copy()
    listed = cases["xfail_entries"] if "xfail_entries" in cases else pd.Series("", cases.index)
    single = cases["xfail_entry"]
    cases["entry"] = [[int(x) for x in str(v).split(",") if x.strip()] or
                      ([int(e)] if pd.notna(e) else []) for v, e in zip(listed, single)]
    out = cases.explode("entry")
    out = out[out["entry"].notna()].copy()
    out["entry"] = out["entry"].astype(int)
    return out


def ledger(ctx: ReportContext) -> dict:
    entries, err = _entries(ctx)
    matched = _by_entry(case_rows(ctx.h.rows))
    cases = case_rows(ctx.h.rows)
    scenario_latest: dict[str, set] = {}
    for g in ctx.groups:
        scenario_latest.setdefault(g.scenario, set()).add(g.runs[-1])
    combos = set(zip(cases["scenario"], cases["backend"], cases["device"]))
    rows = []
    for e in entries:
        exercised = any(all(any(fnmatch.fnmatchcase(v, p) for p in e.match.get(k, ["*"]))
                            for k, v in zip(("scenario", "backend", "device"), c))
                        for c in combos)
        rows.append(entry_row(e.number, e.line, e.match, e.reason, e.link, matched,
                              scenario_latest, exercised=exercised, details=e.details,
                              fails=e.failures_text))
    # entries seen in the history that the registry no longer has
    for n in sorted(set(int(x) for x in matched["entry"]) - {e.number for e in entries}):
        m = matched[matched["entry"] == n]
        rows.append(entry_row(n, 0, None, m["xfail_reason"].iloc[-1], "", matched,
                              scenario_latest, gone=True))
    return {"registry": str(ctx.registry_path), "error": err, "entries": rows}


def entry_row(n: int, line: int, match: dict | None, reason: str, link: str,
              matched: pd.DataFrame, scenario_latest: dict[str, set], gone: bool = False,
              exercised: bool = True, details: str = "", fails: str = "") -> dict:
    """One ledger line: what the entry matches, how often, the outcomes and its status; the
    failures it names and its details (the measurements behind the one-line reason)."""
    m = matched[matched["entry"] == n]
    latest_m = m[np.array([ri in scenario_latest.get(s, ()) for s, ri in
                           zip(m["scenario"], m["run_index"])], dtype=bool)]
    status, cls = _status(m, latest_m, match, exercised)
    if gone:
        status += " (entry no longer in the registry)"
    return {"number": n, "line": line,
            "match": (", ".join(f"{k}={'|'.join(v)}" for k, v in match.items()) if match
                      else "(unknown)"),
            "reason": reason, "link": link, "details": details, "fails": fails,
            "link_is_url": link.startswith(("http://", "https://")),
            "n_latest": len(latest_m), "n_all": len(m), "n_runs": m["run_id"].nunique(),
            "outcomes": list(Counter(m["case_outcome"]).items()),
            "status": status, "status_class": cls}


def _status(m: pd.DataFrame, latest_m: pd.DataFrame, match: dict | None,
            exercised: bool) -> tuple[str, str]:
    lo = Counter(latest_m["case_outcome"])
    if m.empty and not exercised:
        where = ", ".join(f"{k} {'|'.join(match[k])}" for k in ("scenario", "backend", "device")
                          if match and k in match)
        return f"not exercised: no run of {where or 'its scenario'} in the history", "skipped"
    if m.empty:
        return "stale: never matched a case", "xpassed"
    if latest_m.empty:
        return "stale: did not match in the latest run of its scenario", "xpassed"
    if lo.get("xpassed"):
        return f"stale: passes now ({lo['xpassed']} case(s)) — remove the entry", "xpassed"
    if lo.get("failed"):
        return "fails, but not the way the entry says", "failed"
    return "ok: failed as expected", "xfailed"
