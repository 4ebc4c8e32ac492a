"""Timing of the latest run (slowest cases, torchrun launches) and the runs of the history."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from harness.report import fmt
from harness.report.context import ReportContext
from harness.report.outcomes import SEVERITY, SHORT, case_rows, outcome

SLOWEST = 15


def timing(ctx: ReportContext) -> dict:
    r = ctx.h.latest
    cases = case_rows(ctx.h.run_rows(r["run_id"]))
    ran = cases[cases["case_outcome"] != "skipped"].sort_values("duration_s", ascending=False)
    slowest = [{"duration_s": c.duration_s, "ref": ctx.case_ref(c.case_id, c.hw, c.backend),
                "outcome": c.case_outcome} for c in ran.head(SLOWEST).itertuples(index=False)]
    launches = [{"name": str(x.get("name", "")), "worker": str(x.get("worker") or "–"),
                 "world_size": str(x.get("world_size", "")), "tasks": str(x.get("tasks", "")),
                 "wall_s": x.get("wall_s"), "overhead_s": x.get("overhead_s"),
                 "returncode": str(x.get("returncode", "")), "timed_out": bool(x.get("timed_out"))}
                for x in (r["meta"].get("launches") or []) if isinstance(x, dict)]
    return {"slowest": slowest, "launches": launches}


def runs(ctx: ReportContext) -> list[dict]:
    """Every run of the history, newest first, with its outcome counts."""
    cases = case_rows(ctx.h.rows)
    per_run = {rid: Counter(outcome(o) for o in g) for rid, g in
               cases.groupby("run_id", sort=False)["case_outcome"]}
    out = []
    for r in ctx.h.runs.iloc[::-1].itertuples(index=False):
        cnt = per_run.get(r.run_id, Counter())
        out.append({"run_id": r.run_id, "date": r.date, "scenarios": list(r.scenarios),
                    "hw": r.hw, "git_sha": r.git_sha or "–", "torch": r.torch_version,
                    "counts": [(o, cnt[o], SHORT[o]) for o in SEVERITY if cnt.get(o)],
                    "wall_s": r.wall_s,
                    "overhead_pct": fmt.share(r.launch_overhead_s, r.wall_s),
                    "file": Path(str(r.file)).name})
    return out
