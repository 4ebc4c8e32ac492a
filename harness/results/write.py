"""Result rows of a run -> pandas -> ``<store>/history/<run>.parquet`` + a per-run CSV summary.

One row per (case, phase, check, quantity, metric) plus one ``check == "case"`` row per case
carrying its pytest outcome and duration. Run metadata (versions, git sha, device, date, launch
overhead) is both repeated in columns (so merged histories stay self-describing) and stored in
the parquet schema metadata under ``harness``.

Every file is written atomically (a hidden temporary file in the same directory, fsync'd, then
``os.replace``): a reader -- or a run killed half-way -- never sees half a file. Parquet pages
carry CRC32 checksums (``write_page_checksum``) that history.read_run verifies, so a flipped
bit in stored data fails loudly instead of reading back as a silently changed value. Run ids
hold the start time, the pid and random bits: runs started in the same second, in one project
directory or on several machines whose histories are merged, never collide.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import secrets
import socket
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from harness.spec import catalog

if TYPE_CHECKING:  # pandas / pyarrow load when a run's rows are written (not at plugin import:
    import pandas as pd  # the rank server starts while pytest collects, launch/rank_server.py)

SCHEMA_VERSION = 2  # 2: coverage rows (metric 'coverage', one per case and unit)
META_KEY = b"harness"
ROW_COLUMNS = ["run_id", "case_id", "scenario", "backend", "device", "recipe", "mesh", "module",
               "dcp", "reshard", "axes", "phase", "check", "quantity", "metric", "value",
               "tolerance", "row_outcome", "detail", "case_outcome", "case_status",
               "duration_s", "xfail_entry", "xfail_entries", "xfail_reason", "skip_reason",
               "repro", "pg_backend", "ranks_per_gpu", "loss", "config", "tolerance_source"]
META_COLUMNS = ["date", "git_sha", "torch_version", "te_version", "gpu_name", "hostname"]
OUTCOMES = ("passed", "failed", "xfailed", "xpassed", "skipped")  # ("interrupted": interrupt.py)


def new_run_id() -> str:
    """``<UTC start>-<pid>-<12 random hex>``, e.g. ``20250101T120000-01234-9f3a1c0b5d2e``
    (48 random bits: two ids of one second and process collide with odds of ~1e-14)."""
    return (datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
            + f"-{os.getpid() % 100000:05d}-{secrets.token_hex(6)}")


def atomic_write(path: Path, write) -> Path:
    """``write(tmp)`` writes the content to a temporary path, which then replaces ``path`` in
    one step. The temporary name is hidden (history readers skip dot files) and unique per
    process and call; it is removed if writing fails."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def git_sha(cwd: Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, timeout=10,
                             capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def run_meta(root: Path, device: str, backend: str, extra_versions: dict) -> dict:
    import torch
    gpu = ""
    if device == "cuda" and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(0)
    return dict(schema_version=SCHEMA_VERSION, date=datetime.now(timezone.utc).isoformat(),
                git_sha=git_sha(root), torch_version=torch.__version__.split("+")[0],
                torch_build=torch.__version__, te_version=extra_versions.get("te") or "",
                python=platform.python_version(), hostname=socket.gethostname(),
                cpu_count=os.cpu_count(), device=device, backend=backend, gpu_name=gpu)


def import_writers() -> None:
    """Import what :func:`frame` and :func:`write_run` use (pandas, pyarrow: about a second),
    so that a run's end does not pay it after its last launch."""
    for name in ("pandas", "pyarrow.parquet"):
        importlib.import_module(name)


def frame(rows: list[dict], meta: dict) -> pd.DataFrame:
    import pandas as pd
    df = pd.DataFrame(rows, columns=ROW_COLUMNS)
    for c in META_COLUMNS:
        df[c] = meta.get(c, "")
    df["xfail_entry"] = df["xfail_entry"].astype("Int64")
    for c in ("value", "tolerance", "duration_s"):
        df[c] = df[c].astype("float64")
    return df


def write_run(report_dir: Path, run_id: str, df: pd.DataFrame, meta: dict) -> dict[str, Path]:
    """history/<run>.parquet (rows + meta) and runs/<run>/{summary.csv, meta.json}."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    hist = Path(report_dir) / "history"
    run_dir = Path(report_dir) / "runs" / run_id
    hist.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(df, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                           META_KEY: json.dumps(meta, default=str).encode()})
    parquet = atomic_write(hist / f"{run_id}.parquet",
                           lambda tmp: pq.write_table(table, tmp, write_page_checksum=True))
    summary = atomic_write(run_dir / "summary.csv",
                           lambda tmp: summarize(df).to_csv(tmp, index=False))
    text = json.dumps(meta, indent=1, default=str)
    meta_path = atomic_write(run_dir / "meta.json", lambda tmp: tmp.write_text(text))
    return {"parquet": parquet, "summary": summary, "meta": meta_path}


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One line per case: outcome, duration, the checks that failed, and one column per check
    and producer with its coverage status (passed / failed / xfailed / not_run) plus a
    ``not_run`` column with the reasons."""
    cols = ["case_id", "backend", "case_outcome", "case_status", "duration_s", "xfail_entry",
            "skip_reason"] + [c for c in ("pg_backend", "ranks_per_gpu") if c in df]
    cases = df[df["check"] == "case"][cols]
    bad = df[(df["check"] != "case") & df["row_outcome"].isin(["fail", "error"])]
    failed: dict[str, set] = {}
    for cid, check, qty in zip(bad["case_id"], bad["check"], bad["quantity"]):
        failed.setdefault(cid, set()).add(f"{check}/{qty}")
    cases = cases.copy()
    cases["failed_checks"] = [", ".join(sorted(failed.get(c, ()))) for c in cases["case_id"]]
    cov = df[df["metric"] == "coverage"]
    if len(cov):
        units = [u for u in catalog.UNITS if u in set(cov["check"])]
        status = cov.pivot_table(index="case_id", columns="check", values="row_outcome",
                                 aggfunc="first").reindex(index=cases["case_id"], columns=units)
        for u in units:  # (a lookup per case and unit, 15,422 for the whole TE matrix: ~3x slower)
            cases[u] = status[u].fillna("").tolist()
        nr = cov[cov["row_outcome"] == "not_run"]
        why: dict[str, list] = {}
        for cid, unit, detail in zip(nr["case_id"], nr["check"], nr["detail"]):
            why.setdefault(cid, []).append(f"{unit}: {detail}")
        cases["not_run"] = ["; ".join(why.get(c, ())) for c in cases["case_id"]]
    return cases


def read_meta(path: Path) -> dict:
    import pyarrow.parquet as pq
    md = pq.read_schema(path).metadata or {}
    return json.loads(md.get(META_KEY, b"{}"))
