"""Load and validate a results history: ``<store>/history/*.parquet``, one file per run.

Merging runs from several CI machines is copying their files into one directory. Every file is
validated before it is used; a file that is corrupt, foreign (not written by
:mod:`harness.results`), of an unknown schema version, or missing required columns is reported
by name with the reason and skipped -- it never stops a report. Data pages are read with their
CRC32 checksums verified (results.write_run writes them), so corruption of stored values is
reported rather than read back as different numbers. Whether the file skipped is the *newest*
run (:func:`file_date`) matters to drift: see drift.unusable_latest.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from harness.results import write as results

#: schema versions this reader understands (``schema_version`` in the ``harness`` metadata)
SUPPORTED_VERSIONS = {1, 2}  # 2 adds coverage rows (metric "coverage")

_STR, _FLOAT, _INT = "string", "float", "integer"
#: required columns and their kind (checked on the parquet schema, before reading any row)
#: columns added after schema 1, filled in when an older file lacks them
OPTIONAL = {"xfail_entries": "", "pg_backend": "", "ranks_per_gpu": "", "loss": "", "config": "",
            "tolerance_source": ""}
REQUIRED: dict[str, str] = {c: _STR for c in results.ROW_COLUMNS if c not in OPTIONAL}
REQUIRED.update(value=_FLOAT, tolerance=_FLOAT, duration_s=_FLOAT, xfail_entry=_INT)
STRING_COLUMNS = ([c for c, k in REQUIRED.items() if k == _STR] + list(OPTIONAL)
                  + list(results.META_COLUMNS))

#: run-level fields taken from the metadata into ``History.runs``
RUN_FIELDS = ["run_id", "date", "git_sha", "torch_version", "te_version", "device", "backend",
              "gpu_name", "hostname", "wall_s", "launch_overhead_s", "launch_wall_s"]


class HistoryError(ValueError):
    """A file that cannot be used; the message says why."""


@dataclass
class History:
    rows: pd.DataFrame  # every row of every valid run, with run_index / run_date / hw columns
    runs: pd.DataFrame  # one row per run, oldest first (run_index 0 .. R-1)
    problems: list[tuple[Path, str]] = field(default_factory=list)
    directory: Path | None = None
    # runs left out by ``load(complete_only=True)``: (run id, interrupted cases, cases)
    interrupted: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.runs.empty

    @property
    def latest(self) -> pd.Series:
        return self.runs.iloc[-1]

    def run_meta(self, run_id: str) -> dict:
        return self.runs.set_index("run_id").loc[run_id, "meta"]

    def run_rows(self, run_id: str) -> pd.DataFrame:
        return self.rows[self.rows["run_id"] == run_id]


def hardware_key(device: str, gpu_name: str, backend: str, pg_backend: str = "",
                 ranks_per_gpu: str = "") -> str:
    """Baselines only compare runs with the same key: device, GPU model, backend and, for a
    case whose ranks shared GPUs (gloo on cuda), that and how many ranks a GPU held -- a
    shared run's numbers never pool with a GPU-per-rank (nccl) run's."""
    key = f"{device or '?'}/{gpu_name or '-'}/{backend or '?'}"
    shared = device == "cuda" and pg_backend == "gloo"
    return f"{key}/gloo-shared-x{ranks_per_gpu or '?'}" if shared else key


def _kind_ok(kind: str, t: pa.DataType) -> bool:
    if pa.types.is_null(t):  # an all-null column is fine for any kind
        return True
    if pa.types.is_dictionary(t):
        t = t.value_type
    if kind == _STR:
        return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
    if kind == _FLOAT:
        return pa.types.is_floating(t) or pa.types.is_integer(t)
    if kind == _INT:
        return pa.types.is_integer(t)
    return False


def read_run(path: Path) -> tuple[pd.DataFrame, dict]:
    """One history file -> (rows, meta); :class:`HistoryError` says why a file is unusable."""
    try:
        schema = pq.read_schema(path)
    except Exception as e:  # noqa: BLE001 -- any reader error means "not a parquet file"
        raise HistoryError(f"not a readable parquet file ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''})") from None
    md = schema.metadata or {}
    if results.META_KEY not in md:
        raise HistoryError("foreign parquet file: no 'harness' run metadata "
                           "(not written by harness.results)")
    try:
        meta = json.loads(md[results.META_KEY])
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        raise HistoryError(f"run metadata is not valid JSON ({e})") from None
    version = meta.get("schema_version")
    if version not in SUPPORTED_VERSIONS:
        raise HistoryError(f"schema_version {version!r} not supported (this harness reads "
                           f"{', '.join(map(str, sorted(SUPPORTED_VERSIONS)))})")
    names = set(schema.names)
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        raise HistoryError(f"missing required column(s): {', '.join(missing)}")
    for col, kind in REQUIRED.items():
        t = schema.field(col).type
        if not _kind_ok(kind, t):
            raise HistoryError(f"column {col!r} has type {t}, expected {kind}")
    try:  # page CRCs (results.write_run writes them): a flipped bit fails, never reads back
        df = pq.read_table(path, page_checksum_verification=True).to_pandas()
    except Exception as e:  # noqa: BLE001 -- truncated / corrupt data pages
        raise HistoryError(f"cannot read rows ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''})") from None
    if df.empty:
        raise HistoryError("no result rows")
    run_id = str(meta.get("run_id") or path.stem)
    ids = set(df["run_id"].dropna().astype(str))
    if ids != {run_id}:
        raise HistoryError(f"rows name run(s) {sorted(ids)[:3]} but the metadata says {run_id!r}")
    meta["run_id"] = run_id
    return df, meta


def _normalize(df: pd.DataFrame, meta: dict) -> pd.DataFrame:
    df = df.copy()
    for c in results.META_COLUMNS:
        if c not in df.columns:
            df[c] = meta.get(c, "")
    for c, default in OPTIONAL.items():
        if c not in df.columns:
            df[c] = default
    if "xfail_entries" in df.columns:  # schema 1: one entry per case
        one = df["xfail_entry"].astype(object).where(df["xfail_entry"].notna(), "")
        df["xfail_entries"] = df["xfail_entries"].where(
            df["xfail_entries"].astype(str) != "", one.map(lambda x: str(int(x)) if x != "" else ""))
    for c in STRING_COLUMNS:
        df[c] = df[c].astype(object).where(df[c].notna(), "").astype(str)
    for c in ("value", "tolerance", "duration_s"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    df["xfail_entry"] = pd.to_numeric(df["xfail_entry"], errors="coerce").astype("Int64")
    return df


def _parse_date(s) -> pd.Timestamp:
    try:
        ts = pd.Timestamp(s)
    except (ValueError, TypeError):
        return pd.NaT
    if ts is pd.NaT:
        return ts
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def _run_id_date(run_id: str) -> pd.Timestamp:
    m = re.match(r"(\d{8}T\d{6})", run_id)
    return _parse_date(m.group(1)) if m else pd.NaT


def file_date(path: Path) -> pd.Timestamp:
    """When the run of a (possibly unreadable) history file started: the ``date`` in its
    metadata if the footer still reads, else the time in a run-id file name, else the file's
    modification time."""
    try:
        date = _parse_date(results.read_meta(path).get("date"))
    except Exception:  # noqa: BLE001 -- unreadable footer: fall back to the name
        date = pd.NaT
    if date is pd.NaT:
        date = _run_id_date(Path(path).stem)
    if date is pd.NaT:
        try:
            date = pd.Timestamp(Path(path).stat().st_mtime, unit="s", tz="UTC")
        except OSError:
            date = pd.NaT
    return date


def _count_cases(f: pd.DataFrame, outcome: str | None = None) -> int:
    case = (f["check"] == "case") & (f["metric"] == "duration_s")
    return int((case & (f["case_outcome"] == outcome)).sum() if outcome else case.sum())


def load(directory: str | Path, complete_only: bool = False) -> History:
    """Every valid run under ``directory`` (non-recursive), oldest first. ``complete_only``:
    without the runs a stop signal cut short (a case ``interrupted``): such a run is not a
    result -- its latest values are missing, not unchanged -- so drift and rejudge leave it
    out and say so (``History.interrupted``)."""
    directory = Path(directory)
    problems: list[tuple[Path, str]] = []
    frames, metas = [], []
    seen: dict[str, Path] = {}
    files = sorted(p for p in directory.iterdir()) if directory.is_dir() else []
    for path in files:
        if path.name.startswith(".") or path.is_dir():
            continue
        if path.suffix != ".parquet":
            problems.append((path, "not a .parquet file; ignored"))
            continue
        try:
            df, meta = read_run(path)
        except HistoryError as e:
            problems.append((path, str(e)))
            continue
        except OSError as e:
            problems.append((path, f"cannot open ({e})"))
            continue
        rid = meta["run_id"]
        if rid in seen:
            problems.append((path, f"duplicate of run {rid} (already read from {seen[rid].name})"))
            continue
        seen[rid] = path
        date = _parse_date(meta.get("date"))
        if date is pd.NaT:
            date = _run_id_date(rid)
        meta["_date"] = date
        meta["_file"] = path
        frames.append(_normalize(df, meta))
        metas.append(meta)

    stopped = []
    if complete_only:
        cut = [(m, f) for m, f in zip(metas, frames) if _count_cases(f, "interrupted")]
        stopped = [(m["run_id"], _count_cases(f, "interrupted"), _count_cases(f)) for m, f in cut]
        kept = [(m, f) for m, f in zip(metas, frames) if not _count_cases(f, "interrupted")]
        metas, frames = [m for m, _ in kept], [f for _, f in kept]
    runs = pd.DataFrame([_run_record(m) for m in metas],
                        columns=RUN_FIELDS + ["scenarios", "n_cases", "date_ts", "file", "hw",
                                             "meta"])
    if metas:
        n_cases = {m["run_id"]: _count_cases(f) for m, f in zip(metas, frames)}
        runs["n_cases"] = runs["run_id"].map(n_cases)
        runs = runs.sort_values(["date_ts", "run_id"], na_position="first", kind="stable")
        runs = runs.reset_index(drop=True)
        runs["run_index"] = range(len(runs))
        rows = pd.concat(frames, ignore_index=True)
        idx = dict(zip(runs["run_id"], runs["run_index"]))
        rows["run_index"] = rows["run_id"].map(idx).astype(int)
        rows["run_date"] = rows["run_id"].map(dict(zip(runs["run_id"], runs["date_ts"])))
        rows["hw"] = [hardware_key(d, g, b, pg, n) for d, g, b, pg, n in
                      zip(rows["device"], rows["gpu_name"], rows["backend"],
                          rows["pg_backend"], rows["ranks_per_gpu"])]
        rows = rows.sort_values("run_index", kind="stable").reset_index(drop=True)
    else:
        runs["run_index"] = pd.Series(dtype=int)
        rows = pd.DataFrame(columns=list(results.ROW_COLUMNS) + list(results.META_COLUMNS)
                            + ["run_index", "run_date", "hw"])
    return History(rows=rows, runs=runs, problems=problems, directory=directory,
                   interrupted=stopped)


def _run_record(meta: dict) -> dict:
    rec = {k: meta.get(k, "") for k in RUN_FIELDS}
    for k in ("wall_s", "launch_overhead_s", "launch_wall_s"):
        try:
            rec[k] = float(rec[k]) if rec[k] not in ("", None) else float("nan")
        except (TypeError, ValueError):
            rec[k] = float("nan")
    for k in ("git_sha", "torch_version", "te_version", "device", "backend", "gpu_name",
              "hostname", "date"):
        rec[k] = "" if rec[k] is None else str(rec[k])
    sc = meta.get("scenarios") or []
    rec["scenarios"] = [str(s) for s in sc] if isinstance(sc, list) else [str(sc)]
    rec["n_cases"] = 0
    rec["date_ts"] = meta["_date"]
    rec["file"] = meta["_file"]
    rec["hw"] = hardware_key(rec["device"], rec["gpu_name"], rec["backend"])
    rec["meta"] = meta
    return rec


def format_problems(problems: list[tuple[Path, str]]) -> list[str]:
    return [f"skipped {p}: {why}" for p, why in problems]


def format_interrupted(h: History) -> list[str]:
    return [f"skipped run {rid}: interrupted ({n} of {total} cases did not finish); a stopped "
            f"run is not a result" for rid, n, total in h.interrupted]
