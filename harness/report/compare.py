"""``python -m harness compare``: two recorded runs, case by case -- e.g. a GPU matrix run on 2
GPUs (a GPU per rank, nccl) against one of the same commit on one GPU (its ranks sharing it
over gloo).

For every case id of either run: its outcome (``case_outcome`` of its ``case`` row), the xfail
registry entry it matched (``xfail_entries``; a schema-1 file's ``xfail_entry``), the reason it
was skipped (``skip_reason``) and how its ranks ran (``pg_backend``, ``ranks_per_gpu``). A case
differs when its outcome, entry or skip reason does, or when only one run has it; its process
groups are shown, never a difference (they are what such a comparison varies). The world size
(``--only-world``) is the case's largest, as pytest's ``--world-size`` takes it: its mesh's
(column ``mesh``) or, when larger, its reshard target's (column ``reshard``, ``to_<mesh>``).

The output is markdown, printed and with ``--out`` also written to a file. Exit 0: nothing
differs; 1: some case differs or is in one run only; 2: bad input (one line on stderr)."""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness.report import outcomes, outfile
from harness.report.history import HistoryError, file_date, read_run
from harness.spec.matrix import reshard_target
from harness.spec.mesh import MeshError, parse_mesh

COMPARED = ("outcome", "entry", "skip_reason")  # what makes a case differ
SHOWN_FAILURES = 5  # failing check rows listed per case and run


@dataclass
class Run:
    label: str
    path: Path
    meta: dict
    # case id -> outcome, entry, skip_reason, summary, pg_backend, ranks_per_gpu, world
    cases: dict[str, dict]
    failing: dict[str, list[str]]  # case id -> its failing check rows, as text


def _world_size(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"a world size is >= 1, got {n}")
    return n


def add_arguments(p: argparse.ArgumentParser) -> None:
    for side in ("a", "b"):
        p.add_argument(f"--{side}", required=True, metavar="DIR_OR_PARQUET",
                       help=f"run {side.upper()}: a history parquet file, or a results store "
                            f"(or a history directory) whose newest run is taken")
    p.add_argument("--label-a", default="A", metavar="NAME", help="run A's name in the output")
    p.add_argument("--label-b", default="B", metavar="NAME", help="run B's name in the output")
    p.add_argument("--only-world", type=_world_size, metavar="N",
                   help="only the cases whose largest world size (mesh or reshard target) is N, "
                        "as pytest's --world-size selects them")
    p.add_argument("--out", metavar="FILE.md", help="also write the comparison there (markdown)")


def newest_parquet(flag: str, path: Path) -> Path:
    """``path`` itself if a file, else the newest ``*.parquet`` of ``path/history`` (a results
    store) or of ``path`` (a history directory): by the run's date (history.file_date)."""
    if not path.exists():
        raise HistoryError(f"{flag} {path}: no such file or directory")
    if not path.is_dir():
        return path
    d = path / "history" if (path / "history").is_dir() else path
    files = [p for p in d.iterdir()
             if p.suffix == ".parquet" and not p.name.startswith(".") and p.is_file()]
    if not files:
        raise HistoryError(f"{flag} {path}: no history parquet file in {d} (a results store "
                           f"holds history/<run_id>.parquet)")
    return max(files, key=lambda p: (file_date(p).value, p.name))  # NaT's value is the least


def _text(s: pd.Series) -> list[str]:
    return s.astype(object).where(s.notna(), "").astype(str).str.strip().tolist()


def _entry(entries: str, entry) -> str:
    """The entry ids a case matched ("3", "3,5"); schema 1 has only ``xfail_entry``."""
    if entries:
        return entries
    return "" if pd.isna(entry) else str(int(entry))


def _world(mesh: str, reshard: str) -> int | None:
    """The case's largest world size: its mesh's or its reshard target's (pytest's
    ``--world-size`` selects by it too); None for a mesh that does not parse."""
    try:
        target = reshard_target(reshard)
        return max(parse_mesh(mesh).world_size, target.world_size if target else 0)
    except MeshError:
        return None


def _failure(r) -> str:
    name = f"{r.check}/{r.quantity}/{r.metric}"
    if r.row_outcome == "error" and r.detail:  # an exception: its message says more
        return f"{name}: {str(r.detail)[:200]}"
    if pd.notna(r.value) and pd.notna(r.tolerance):
        return f"{name} = {r.value:.4g} (tolerance {r.tolerance:.4g})"
    if pd.notna(r.value):
        return f"{name} = {r.value:.4g}" + (f": {r.detail}" if r.detail else "")
    return f"{name}: {r.detail}" if r.detail else name


def load_run(flag: str, given: str, label: str) -> Run:
    path = newest_parquet(flag, Path(given).expanduser())
    try:
        df, meta = read_run(path)
    except HistoryError as e:
        raise HistoryError(f"{flag} {path}: {e}") from None
    for c in ("xfail_entries", "pg_backend", "ranks_per_gpu"):  # newer than schema 1
        if c not in df.columns:
            df[c] = ""
    case = outcomes.case_rows(df).drop_duplicates("case_id")
    cols = dict(outcome=_text(case["case_outcome"]),
                entry=[_entry(s, n) for s, n in zip(_text(case["xfail_entries"]),
                                                    case["xfail_entry"])],
                skip_reason=_text(case["skip_reason"]), summary=_text(case["detail"]),
                pg_backend=_text(case["pg_backend"]),
                ranks_per_gpu=_text(case["ranks_per_gpu"]),
                world=[_world(m, r) for m, r in zip(_text(case["mesh"]),
                                                     _text(case["reshard"]))])
    cases = {cid: {k: v[i] for k, v in cols.items()}
             for i, cid in enumerate(_text(case["case_id"]))}
    bad = outcomes.check_rows(df)
    failing: dict[str, list[str]] = {}
    for r in bad[bad["row_outcome"].isin(outcomes.FAILED_ROWS)].itertuples():
        failing.setdefault(str(r.case_id), []).append(_failure(r))
    return Run(label, path, meta, cases, failing)


def compare(a: Run, b: Run, only_world: int | None = None) -> list[dict]:
    """One dict per case id of either run (sorted): case_id, a, b (the case's fields or None)
    and ``differs``: the fields that differ, or ["only in <label>"]."""
    out = []
    for cid in sorted(set(a.cases) | set(b.cases)):
        ca, cb = a.cases.get(cid), b.cases.get(cid)
        if only_world is not None and (ca or cb)["world"] != only_world:
            continue
        if ca is None or cb is None:
            differs = [f"only in {(a if cb is None else b).label}"]
        else:
            differs = [f for f in COMPARED if ca[f] != cb[f]]
        out.append(dict(case_id=cid, a=ca, b=cb, differs=differs))
    return out


def _cell(s) -> str:
    return " ".join(str(s).split()).replace("|", "\\|") or "—"


def _table(head: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(_cell(h) if h else " " for h in head) + " |",
            "|" + "---|" * len(head)] + \
           ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]


def _ran(c: dict | None) -> str:
    if c is None:
        return "—"
    pg, n = c["pg_backend"] or "not recorded", c["ranks_per_gpu"]
    return f"{pg}, {n} rank{'' if n == '1' else 's'}/GPU" if n else pg


def _value(field: str, c: dict) -> str:
    v = c[field]
    if field == "entry":
        return f"entry {v}" if v else "no entry"
    if field == "skip_reason":
        return f"skip: {v}" if v else "no skip reason"
    return v or "no outcome"


def _values(d: dict, c: dict | None) -> str:
    if c is None:
        return "—"
    fields = [f for f in COMPARED if f in d["differs"]] or \
             ["outcome"] + [f for f in COMPARED[1:] if c[f]]  # only in one run: what it had
    return "; ".join(_value(f, c) for f in fields)


def _crosstab(both: list[dict], la: str, lb: str) -> list[str]:
    if not both:
        return ["No case is in both runs."]
    t = pd.crosstab(pd.Series([d["a"]["outcome"] for d in both], name="a"),
                    pd.Series([d["b"]["outcome"] for d in both], name="b"))
    def order(xs):  # worst first (outcomes.SEVERITY), anything else after
        return sorted(xs, key=lambda o: (outcomes.SEVERITY + [o]).index(o))
    t = t.reindex(index=order(t.index), columns=order(t.columns), fill_value=0)
    return _table([f"{la} \\ {lb}"] + list(t.columns),
                  [[o] + [str(n) for n in t.loc[o]] for o in t.index])


def _groups(run: Run, ids: set[str]) -> str:
    n = Counter(_ran(c) for cid, c in run.cases.items() if cid in ids)
    return ", ".join(f"{k}: {v}" for k, v in sorted(n.items())) or "—"


def render(a: Run, b: Run, result: list[dict], only_world: int | None = None) -> str:
    la, lb = a.label, b.label
    both = [d for d in result if d["a"] is not None and d["b"] is not None]
    differ = [d for d in result if d["differs"]]
    ids = {d["case_id"] for d in result}
    meta = [("run", "run_id"), ("git sha", "git_sha"), ("date", "date"), ("device", "device"),
            ("GPU", "gpu_name"), ("host", "hostname")]
    lines = [f"# {la} vs {lb}", ""] + _table(
        ["", la, lb], [["file", a.path, b.path]]
        + [[name, a.meta.get(k, ""), b.meta.get(k, "")] for name, k in meta]
        + [["cases", sum(c in a.cases for c in ids), sum(c in b.cases for c in ids)],
           ["process groups", _groups(a, ids), _groups(b, ids)]])
    sha_a, sha_b = a.meta.get("git_sha") or "?", b.meta.get("git_sha") or "?"
    if sha_a != sha_b:
        lines += ["", f"Note: the runs are of different commits ({sha_a}, {sha_b}): an xfail "
                      f"entry's number is its registry's at that commit."]
    if only_world is not None:
        lines += ["", f"Only the cases of world size {only_world} (the larger of the case's "
                      f"mesh and reshard target)."]
    n_a = sum(d["b"] is None for d in result)
    n_b = sum(d["a"] is None for d in result)
    n_diff = sum(bool(d["differs"]) for d in both)
    lines += ["", f"**{len(both)} cases in both: {len(both) - n_diff} same (outcome, entry, "
                  f"skip reason), {n_diff} differ; {n_a} only in {la}, {n_b} only in {lb}.**",
              "", f"## Outcomes (rows {la}, columns {lb}; the cases in both)", ""]
    lines += _crosstab(both, la, lb)
    lines += ["", f"## Differing cases ({len(differ)})", ""]
    lines += _table(["case", "differs", la, lb, f"{la} ran", f"{lb} ran"],
                    [[d["case_id"], ", ".join(d["differs"]), _values(d, d["a"]),
                      _values(d, d["b"]), _ran(d["a"]), _ran(d["b"])] for d in differ]) \
        if differ else ["None."]
    failures = [(d["case_id"], run.label, c["outcome"], run.failing.get(d["case_id"])
                 or [f"no failing check row; the case: {c['summary']}"])
                for d in differ for c, run in ((d["a"], a), (d["b"], b))
                if c is not None and (run.failing.get(d["case_id"]) or c["outcome"] == "failed")]
    if failures:
        lines += ["", "## Failing checks of the differing cases", ""]
        for cid, label, outcome, rows in failures:
            more = f"; and {len(rows) - SHOWN_FAILURES} more" if len(rows) > SHOWN_FAILURES else ""
            lines.append(f"* {_cell(cid)} ({_cell(label)}, {outcome}): "
                         + "; ".join(_cell(r) for r in rows[:SHOWN_FAILURES]) + more)
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Exit 0: no case differs; 1: some case differs or is in one run only; 2: bad input."""
    a = load_run("--a", args.a, args.label_a)
    b = load_run("--b", args.b, args.label_b)
    result = compare(a, b, args.only_world)
    if not result:
        raise HistoryError(f"--only-world {args.only_world}: no case of that world size in "
                           f"either run" if args.only_world is not None else
                           "no recorded case in either run")
    text = render(a, b, result, args.only_world)
    if args.out is not None:
        outfile.write_text("--out", Path(args.out), text)
    print(text, end="")
    return 1 if any(d["differs"] for d in result) else 0
