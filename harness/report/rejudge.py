"""``python -m harness rejudge``: judge recorded runs again against the xfail registry as it
is now -- which cases' verdicts an edit of ``scenarios/xfails.yaml`` (with ``--tolerances``:
and of the calibration) changes, without running them again -- and, for every failure an entry bounds (``up_to`` / ``beyond``), the largest
size measured in those runs against its bound (the margin a sized xfail keeps).

Versions and GPU capability come from each run's recorded metadata (capability where the
history has it; entries that ask for one match no run without it)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from harness.report.history import format_interrupted, load
from harness.spec import catalog
from harness.spec.matrix import Case
from harness.verdict import judge as verdict
from harness.verdict import registry, registry_file

ROOT = Path(__file__).resolve().parents[2]  # the repository (scenarios/ is beside harness/)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--history", action="append", required=True, metavar="DIR",
                   help="a history directory (a results store's DIR/history, e.g. "
                        "reports/history); repeat for several")
    p.add_argument("--registry", default=str(ROOT / "scenarios" / "xfails.yaml"), metavar="FILE")
    p.add_argument("--tolerances", action="store_true",
                   help="also judge the calibrated quantities against today's tolerances "
                        "(harness/calibration/measured.csv) instead of the recorded ones")


def _axes(raw) -> dict:
    d = json.loads(raw) if isinstance(raw, str) else raw
    return dict(d) if isinstance(d, dict) else {k: v for k, v in d}


def _case_rows(g) -> list[dict]:
    return [dict(phase=r.phase, check=r.check, quantity=r.quantity, metric=r.metric,
                 value=r.value, outcome=r.row_outcome, detail=r.detail)
            for r in g.itertuples() if r.check != "case"]


def rejudge(rows, reg: registry.Registry) -> tuple[list[dict], dict]:
    """(one dict per recorded case: case_id, run_id, was, now, message) and, per bounded
    failure (entry number, failure text), metric -> (largest measured, bound)."""
    out, sizes = [], defaultdict(dict)
    for (run_id, cid), g in rows.groupby(["run_id", "case_id"], sort=False):
        first = g.iloc[0]
        if first["case_outcome"] == "skipped":
            continue
        env = {"te": first.get("te_version") or None, "torch": first.get("torch_version")}
        case = Case(scenario=first["scenario"], backend=first["backend"],
                    axes=tuple(_axes(first["axes"]).items()), model=None, train=None, checks=())
        entries = reg.match(case, first["device"], env)
        case_rows = _case_rows(g)
        v = verdict.judge(case_rows, first["case_status"] or "ok", [], entries)
        out.append(dict(run_id=run_id, case_id=cid, was=first["case_outcome"], now=v.outcome,
                        message=v.message))
        bad = verdict.failing_rows(case_rows, "ok", [])
        for r, vals in zip(bad, verdict.comparison_values(bad)):
            for e in entries:
                for f in e.fails:
                    if (f.up_to or f.beyond) and f.explains(r, vals):
                        _track(sizes[(e.number, str(f))], f, vals, cid)
    return out, dict(sizes)


def _track(acc: dict, f: registry.Failure, vals: dict, case_id: str) -> None:
    """up_to: the largest value it explained; beyond: the smallest (the margins to the bound),
    with the case that measured it."""
    for op, sizes in (("<=", f.up_to), (">", f.beyond)):
        for m, bound in sizes:
            if m not in vals:
                continue
            old = acc.get((op, m))
            closer = old is None or (vals[m] > old[0] if op == "<=" else vals[m] < old[0])
            if closer:
                acc[(op, m)] = (vals[m], bound, case_id)


def _margin(op: str, v: float, bound: float) -> str:
    if op == "<=":
        return f"bound {bound:g} = {bound / v:.3g}x it" if v > 0 else f"bound {bound:g}"
    return f"bound {bound:g}: it is {v / bound:.3g}x that" if bound > 0 else f"bound {bound:g}"


def run(args: argparse.Namespace) -> int:
    """Exit 0: no verdict changes; 1: some change; 2: bad input (one line on stderr)."""
    try:
        reg = registry_file.load(args.registry, set(catalog.CORE_AXES) | set(catalog.EXTRA_AXES))
    except registry.RegistryError as e:
        print(f"error: --registry: {e}", file=sys.stderr)
        return 2
    import pandas as pd
    frames = []
    for d in args.history:
        if not Path(d).is_dir():
            why = "not a directory" if Path(d).exists() else "no such directory"
            print(f"error: --history {d}: {why} (a history is a directory of <run_id>.parquet "
                  f"files)", file=sys.stderr)
            return 2
        h = load(d, complete_only=True)  # a stopped run's unfinished cases are no verdicts
        for path, why in h.problems:
            print(f"skipped {path}: {why}")
        for line in format_interrupted(h):
            print(line)
        frames.append(h.rows)
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if rows.empty:
        print("no recorded cases in " + ", ".join(args.history))
        return 2
    if args.tolerances:
        from harness.report import retolerance
        rows, n = retolerance.apply(rows)
        print(f"{n} calibrated comparisons change outcome under today's tolerances")
    try:
        cases, sizes = rejudge(rows, reg)
    except registry.RegistryError as e:  # two entries for one case, a regex past its limit
        print(f"error: {e}", file=sys.stderr)
        return 2
    changed = [c for c in cases if c["was"] != c["now"]]
    print(f"{len(cases)} recorded cases judged against {args.registry}: "
          + ", ".join(f"{n} {w} -> {v}" for (w, v), n in
                      sorted(Counter((c['was'], c['now']) for c in cases).items())))
    for c in changed:
        print(f"  {c['case_id']} ({c['run_id']}): {c['was']} -> {c['now']}")
        for line in c["message"].splitlines()[:3]:
            print(f"      {line[:300]}")
    if sizes:
        print("sized failures: the largest size each up_to explained, the smallest each beyond "
              "explained, and the margin to its bound")
        for (n, f), ms in sorted(sizes.items()):
            print(f"  entry {n} {f}: " + ", ".join(
                f"{m} {v:.4g} ({_margin(op, v, b)}; {cid})"
                for (op, m), (v, b, cid) in sorted(ms.items())))
    return 1 if changed else 0
