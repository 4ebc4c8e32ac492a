"""The top of the report: skipped files, the latest run, what changed, drift alerts."""

from __future__ import annotations

from collections import Counter

from harness.report import fmt
from harness.report.context import ReportContext
from harness.report.outcomes import SEVERITY, case_rows, outcome

MAX_CHANGES = 60


def problems(ctx: ReportContext) -> list[dict]:
    """History files that were skipped, and why."""
    return [{"path": str(p), "why": why} for p, why in ctx.h.problems]


def process_groups(cases) -> str:
    """How the run's cases ran their ranks: "nccl: 160 cases; gloo, ranks sharing GPUs (up to
    8 a GPU): 215 cases" (older histories, which do not say: "")."""
    if "pg_backend" not in cases or not cases["pg_backend"].astype(bool).any():
        return ""
    ran = cases[cases["case_outcome"] != "skipped"]
    shared = ran[(ran["device"] == "cuda") & (ran["pg_backend"] == "gloo")]
    parts = [f"{b}: {n} cases" for b, n in Counter(ran["pg_backend"]).items()
             if b and not (b == "gloo" and len(shared))]
    if len(shared):
        most = max(int(x) for x in shared["ranks_per_gpu"] if str(x).isdigit()) \
            if any(str(x).isdigit() for x in shared["ranks_per_gpu"]) else "?"
        parts.append(f"gloo, ranks sharing GPUs (up to {most} a GPU): {len(shared)} cases")
    return "; ".join(parts)


def header(ctx: ReportContext) -> dict:
    """The latest run: its metadata, outcome counts and a one-word verdict."""
    h = ctx.h
    r = h.latest
    meta = r["meta"]
    cases = case_rows(h.run_rows(r["run_id"]))
    counts = Counter(outcome(o) for o in cases["case_outcome"])
    n_drift = len(ctx.drift.flags)
    bad = counts.get("failed", 0) + counts.get("xpassed", 0) + counts.get("interrupted", 0) \
        + n_drift
    gpu = r["gpu_name"] or ("none" if r["device"] == "cpu" else "?")
    return {
        "run_id": r["run_id"],
        "date": r["date"],
        "scenarios": list(r["scenarios"]),
        "git_sha": r["git_sha"] or "unknown",
        "torch": str(meta.get("torch_build") or r["torch_version"] or "?"),
        "te": r["te_version"] or "not installed",
        "device": r["device"] or "?",
        "gpu": gpu,
        "backend": r["backend"] or "?",
        "process_groups": process_groups(cases),
        # fork: agents and ranks forked from the run's rank server; fresh: a new Python each
        "rank_start": meta.get("rank_start") or "?",
        "host": r["hostname"] or "?",
        "wall_s": r["wall_s"],
        "overhead_s": r["launch_overhead_s"],
        "overhead_pct": fmt.share(r["launch_overhead_s"], r["wall_s"]),
        "n_runs": len(h.runs),
        "directory": str(h.directory or "?"),
        "n_cases": len(cases),
        "counts": [(o, counts.get(o, 0)) for o in reversed(SEVERITY)
                   if o != "interrupted" or counts.get(o)],  # a stopped run says so
        "n_drift": n_drift,
        "all_good": bad == 0,
    }


def changes(ctx: ReportContext) -> list[dict]:
    """Per group: the latest run against the one before it (outcome changes, new, removed)."""
    out = []
    for g in ctx.groups:
        cur = case_rows(ctx.rows(g))
        item = {"label": g.label, "first": len(g.runs) < 2}
        out.append(item)
        if item["first"]:
            continue
        prev = case_rows(ctx.rows(g, g.runs[-2]))
        a = dict(zip(prev["case_id"], prev["case_outcome"]))
        b = dict(zip(cur["case_id"], cur["case_outcome"]))
        changed = [(c, a[c], b[c]) for c in b if c in a and a[c] != b[c]]
        new = [c for c in b if c not in a]
        gone = [c for c in a if c not in b]

        def ref(c):
            return ctx.case_ref(c, g.hw, g.backend)

        shown = (min(len(changed), MAX_CHANGES) + min(len(new), MAX_CHANGES)
                 + min(len(gone), MAX_CHANGES))
        item.update(
            prev_run=ctx.run(g.runs[-2])["run_id"], n_cases=len(b),
            n_changed=len(changed), n_new=len(new), n_gone=len(gone),
            changed=[{"ref": ref(c), "was": o1, "now": o2} for c, o1, o2 in changed[:MAX_CHANGES]],
            new=[{"ref": ref(c), "now": b[c]} for c in new[:MAX_CHANGES]],
            gone=[{"case": c, "was": a[c]} for c in gone[:MAX_CHANGES]],
            more=len(changed) + len(new) + len(gone) - shown)
    return out


def drift_alerts(ctx: ReportContext) -> dict:
    """The flagged series of ``python -m harness drift`` (same rule, same settings)."""
    d = ctx.drift
    flags = [{"ref": ctx.case_ref(r.case_id, r.hw, r.backend),
              "series": f"{r.check}/{r.quantity}/{r.metric}", "hw": r.hw,
              "base_median": r.base_median, "base_n": r.base_n, "value": r.value,
              "tolerance": r.tolerance, "risk": r.risk, "reason": r.reason}
             for r in d.flags.itertuples(index=False)]
    return {"rule": ctx.cfg.describe(), "flags": flags, "notes": list(d.notes)}
