"""``python -m harness calibrate``: regenerate ``measured.csv`` from calibration runs.

    python -m harness calibrate --run            # run the calibration scenario on CPU first
    python -m harness calibrate --history DIR    # also read these histories (e.g. GPU runs)
    python -m harness calibrate --package DIR --into reports/calibration/NAME  # then commit it

It reads every history file of the ``calibration`` scenario in the given directories (default:
``reports/calibration/*/history`` -- committed calibration runs, CPU and GPU -- and
``reports/history``), derives the measured errors (``derive.py``), writes
``harness/calibration/measured.csv`` and prints the resulting tolerance table
(docs/tolerances.md) and
the shipped cases left without a population (``coverage.py``).
``--run`` writes its runs to ``reports/calibration/cpu/`` (replacing what was there).
``--package`` copies a run's calibration histories (a ``--report-dir``'s ``history``) into
``<into>/history`` slimmed to what the derivation reads (``derive.packaged``), then derives as
usual with them.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

from harness.calibration import MEASURED, derive, write


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", action="store_true",
                   help="first run `pytest --scenario calibration` on the reference and torch "
                        "backends (CPU, several minutes)")
    p.add_argument("--history", action="append", default=None, metavar="DIR",
                   help="history directory to read (repeatable; default: reports/history and "
                        "reports/calibration/*/history; a run's on-demand variants: its "
                        "<report-dir>/calibration_on_demand/history)")
    p.add_argument("--package", metavar="DIR",
                   help="a history directory whose calibration runs join the package: written "
                        "slimmed into --into DIR/history (what the derivation reads)")
    p.add_argument("--into", metavar="DIR",
                   help="with --package: the packaged run's directory (reports/calibration/NAME)")
    p.add_argument("--out", default=str(MEASURED), metavar="FILE",
                   help="where to write the measurements (default: the package's measured.csv)")


def _run_scenario(report_dir: Path) -> None:
    for scenario in derive.SCENARIOS:
        for backend in ("reference", "torch"):
            argv = [sys.executable, "-m", "pytest", "--scenario", scenario, "--backend",
                    backend, "--report-dir", str(report_dir), "-q", "-p", "no:cacheprovider"]
            print("running:", " ".join(argv), flush=True)
            subprocess.run(argv, check=False, timeout=3600)


def _histories(d: Path):
    """(file, rows) of each history file in ``d`` that holds calibration runs."""
    for f in sorted(Path(d).glob("*.parquet")):
        try:
            df = pd.read_parquet(f)
        except Exception as e:  # noqa: BLE001 - a broken file is skipped with a reason
            print(f"skipped {f}: {e}", file=sys.stderr)
            continue
        if "scenario" in df and any(map(derive.is_calibration, df["scenario"])):
            yield f, df


def _frames(dirs: list[Path]) -> pd.DataFrame:
    frames = [df for d in dirs for _, df in _histories(d)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def package(src: Path, into: Path) -> list[Path]:
    """Each calibration history file of ``src`` as ``into/history/<name>``, slimmed."""
    (into / "history").mkdir(parents=True, exist_ok=True)
    out = []
    for f, df in _histories(src):
        out.append(into / "history" / f.name)
        derive.packaged(df).to_parquet(out[-1], compression="zstd", index=False)
    return out


def run(args: argparse.Namespace) -> int:
    dirs = [Path(d) for d in (args.history or [])]
    if not args.history:
        dirs = [*sorted(Path("reports/calibration").glob("*/history")), Path("reports/history")]
    if args.package:
        if not args.into:
            print("--package needs --into reports/calibration/NAME", file=sys.stderr)
            return 2
        for f in package(Path(args.package), Path(args.into)):
            print(f"packaged {f} ({f.stat().st_size} bytes)")
        if Path(args.into) / "history" not in dirs:
            dirs.append(Path(args.into) / "history")
    if args.run:
        out = Path("reports/calibration/cpu")
        shutil.rmtree(out, ignore_errors=True)
        _run_scenario(out)
        if out / "history" not in dirs:
            dirs.append(out / "history")
    df = _frames(dirs)
    if df.empty:
        print(f"no calibration runs in {', '.join(map(str, dirs))}: run `python -m harness "
              f"calibrate --run` (or pytest --scenario calibration)", file=sys.stderr)
        return 2
    rows = derive.measured(df)
    if not rows:
        print("the calibration runs hold no measured errors (did every case crash?)",
              file=sys.stderr)
        return 1
    write(rows, Path(args.out))
    beyond = [r for r in rows if r["beyond_previous"] and r["module"] != "*"
              and r["world_size"] != "*" and r["metric"] == "rel_l2"]
    for r in beyond:  # the finest level, once per quantity: what to review before committing
        print(f"beyond the previous tolerance in its run: {r['check']}/{r['quantity']} "
              f"{r['recipe']} {r['backend']}/{r['device']}/{r['pg_backend']} world "
              f"{r['world_size']} {r['module']}: {r['beyond_previous']} of {r['n']} rows")
    print(f"wrote {args.out}: {len(rows)} measurements from "
          f"{df['run_id'].nunique()} run(s), {df['case_id'].nunique()} cases")
    print(markdown_table(Path(args.out)))
    from harness import calibration
    from harness.calibration import coverage
    print(coverage.report(coverage.uncovered(Path("scenarios"), calibration.load(Path(args.out)))))
    return 0


def markdown_table(path: Path = MEASURED) -> str:
    """docs/tolerances.md's table: per population (backend / device / process groups, world
    size, module; ``*`` pooled) the measured statistic (p99, or max: ``tolerances.statistic``),
    factor and tolerance (max_abs / rel-L2)."""
    from harness import calibration
    from harness.calibration import tolerances
    lines = ["| check / quantity | recipe | loss | population | n | measured max-abs / rel-L2 "
             "| factor | tolerance max-abs / rel-L2 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in tolerances.table(measured=calibration.load(path)):
        if r["recipe"] == "*":
            continue
        pop = tolerances.describe(tuple(r[c] for c in derive.POPULATION))
        lines.append(f"| {r['check']} {r['quantity']} | {r['recipe']} | {r['loss']} | {pop} | "
                     f"{r['n']} | {r['statistic']} {r['measured_max_abs']:.2g} / "
                     f"{r['measured_rel_l2']:.2g} | "
                     f"{r['factor']:g} | {r['max_abs']:.2g} / {r['rel_l2']:.2g} |")
    return "\n".join(lines)
