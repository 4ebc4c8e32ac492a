"""Goldens (exact mode): pinned per-step losses for one hardware + software key.

``goldens/<key>.json``, key = ``<device>-<gpu or cpu>-torch<version>-te<version or none>``
(sanitized for a file name), in the Megatron golden-values style::

    {"smoke[fp32-dp2-LayerNormMLP-sync-to_dp4]":
        {"loss": {"start_step": 0, "end_step": 2, "step_interval": 1,
                  "values": [1.0532013177871704, 1.0484539270401, 1.0185208320617676]}}}

Values come from the ``trace`` rows of a run (``check == "trace"``, metric ``step<N>``) and are
compared *exactly*: the floats as stored, bit for bit (NaN equals NaN). On a fixed hardware +
software key the harness is deterministic, so any difference means the numerics changed.

Comparing never writes. ``--update-goldens`` rewrites the file explicitly and prints what changed;
cases of the file that are not in the compared run (another scenario) are kept as they are.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness.report.history import History

_STEP = re.compile(r"step(\d+)$")


def golden_key(meta: dict) -> str:
    key = (f"{meta.get('device') or 'unknown'}-{meta.get('gpu_name') or 'cpu'}"
           f"-torch{meta.get('torch_version') or 'unknown'}-te{meta.get('te_version') or 'none'}")
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", key).strip("_")


def traces(rows: pd.DataFrame) -> dict[str, dict[str, dict]]:
    """case_id -> trace name -> golden entry, from one run's rows."""
    tr = rows[rows["check"] == "trace"]
    out: dict[str, dict[str, dict]] = {}
    for (case, phase, qty), g in tr.groupby(["case_id", "phase", "quantity"], sort=True):
        steps = []
        for metric, value in zip(g["metric"], g["value"]):
            m = _STEP.match(str(metric))
            if m:
                steps.append((int(m.group(1)), float(value)))
        if not steps:
            continue
        steps.sort()
        name = qty if phase in ("", "train") else f"{phase}/{qty}"
        out.setdefault(case, {})[name] = _entry(steps)
    return out


def _entry(steps: list[tuple[int, float]]) -> dict:
    idx = [s for s, _ in steps]
    interval = idx[1] - idx[0] if len(idx) > 1 else 1
    e = {"start_step": idx[0], "end_step": idx[-1], "step_interval": interval,
         "values": [v for _, v in steps]}
    if any(b - a != interval for a, b in zip(idx, idx[1:])):
        e["steps"] = idx  # irregular steps: listed explicitly
    return e


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def diff_entry(name: str, gold: dict, got: dict) -> str | None:
    """None when equal, else a one-line description of the first difference."""
    for k in ("start_step", "end_step", "step_interval", "steps"):
        if gold.get(k) != got.get(k):
            return f"{name}: {k} {gold.get(k)!r} in the golden, {got.get(k)!r} in the run"
    gv, rv = list(gold.get("values", [])), list(got.get("values", []))
    if len(gv) != len(rv):
        return f"{name}: {len(gv)} values in the golden, {len(rv)} in the run"
    bad = [i for i, (a, b) in enumerate(zip(gv, rv)) if not _same(float(a), float(b))]
    if not bad:
        return None
    i = bad[0]
    step = (got.get("steps") or list(range(got["start_step"], got["end_step"] + 1,
                                           got["step_interval"] or 1)))[i]
    return (f"{name}: {len(bad)}/{len(rv)} step(s) differ; first at step {step}: golden "
            f"{float(gv[i])!r}, run {float(rv[i])!r} (diff {float(rv[i]) - float(gv[i]):.3g})")


@dataclass
class GoldenCheck:
    key: str
    path: Path
    run_id: str
    mismatches: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # cases of the run without a golden
    matched: int = 0
    not_checked: list[str] = field(default_factory=list)  # golden cases without a trace here

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.missing


def load_file(path: Path) -> dict:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of case -> traces")
    return data


def compare(golden: dict, run: dict[str, dict[str, dict]], key: str, path: Path,
            run_id: str) -> GoldenCheck:
    res = GoldenCheck(key, path, run_id)
    for case in sorted(run):
        if case not in golden:
            res.missing.append(case)
            continue
        for name, got in sorted(run[case].items()):
            gold = golden[case].get(name) if isinstance(golden[case], dict) else None
            if gold is None:
                res.missing.append(f"{case} ({name})")
                continue
            d = diff_entry(name, gold, got)
            if d is None:
                res.matched += 1
            else:
                res.mismatches.append(f"{case}: {d}")
    res.not_checked = sorted(set(golden) - set(run))
    return res


def update(golden: dict, run: dict[str, dict[str, dict]]) -> tuple[dict, list[str]]:
    """The merged golden document and a list of what changed."""
    new = {k: dict(v) if isinstance(v, dict) else {} for k, v in golden.items()}
    changes = []
    for case in sorted(run):
        for name, got in sorted(run[case].items()):
            prev = golden.get(case)
            old = prev.get(name) if isinstance(prev, dict) else None
            if old is None:
                changes.append(f"added    {case} {name} ({len(got['values'])} steps)")
            else:
                d = diff_entry(name, old, got)
                if d is None:
                    continue
                changes.append(f"changed  {case} {d}")
            new.setdefault(case, {})[name] = got
    return dict(sorted(new.items())), changes


def pick_run(h: History, run_id: str | None) -> pd.Series:
    if run_id is None:
        return h.latest
    sel = h.runs[h.runs["run_id"] == run_id]
    if sel.empty:
        raise KeyError(f"run {run_id!r} is not in the history")
    return sel.iloc[0]


def run(h: History, goldens_dir: Path, do_update: bool, run_id: str | None = None,
        out=print) -> int:
    """The ``goldens`` subcommand. 0: match (or updated), 1: mismatch / missing, 2: no data."""
    r = pick_run(h, run_id)
    meta = r["meta"]
    key = golden_key(meta)
    path = Path(goldens_dir) / f"{key}.json"
    got = traces(h.run_rows(r["run_id"]))
    out(f"run {r['run_id']} ({', '.join(r['scenarios']) or '?'}, {r['date']}): golden key {key}")
    if not got:
        out(f"run {r['run_id']} has no per-step trace rows (check == 'trace'); nothing to compare")
        return 2
    try:
        golden = load_file(path) if path.is_file() else None
    except ValueError as e:  # JSONDecodeError is a ValueError
        out(f"error: {path}: not a valid goldens file ({e})")
        if not do_update:
            return 1
        golden = None
    if do_update:
        merged, changes = update(golden or {}, got)
        if golden is not None and not changes:
            out(f"{path}: up to date ({len(got)} case(s)); not rewritten")
            return 0
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(merged, indent=1) + "\n")
        tmp.replace(path)
        out(f"{'created' if golden is None else 'updated'} {path}: {len(changes)} change(s)")
        for c in changes:
            out(f"  {c}")
        return 0
    if golden is None:
        out(f"no goldens file {path} for this hardware + software key; create it with "
            f"`python -m harness goldens --update-goldens` after checking the run is good")
        return 1
    res = compare(golden, got, key, path, r["run_id"])
    for m in res.mismatches:
        out(f"MISMATCH {m}")
    for m in res.missing:
        out(f"MISSING  {m}: no golden (add it with --update-goldens)")
    if res.not_checked:
        out(f"{len(res.not_checked)} golden case(s) not in this run; not checked")
    verdict = "OK" if res.ok else "FAILED"
    out(f"{verdict}: {res.matched} trace(s) bitwise equal, {len(res.mismatches)} mismatch(es), "
        f"{len(res.missing)} missing, against {path}")
    return 0 if res.ok else 1
