"""The report, drift and goldens subcommands of ``python -m harness``: their arguments and run
functions (each returns the exit code); ``harness/__main__.py`` registers every subcommand.

Exit codes: 0 ok; 1 the check failed (drift with --fail-on-drift, goldens mismatch); 2 nothing
to work on (empty or unreadable history, bad arguments).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.report import drift as drift_mod
from harness.report import goldens as goldens_mod
from harness.report import history as history_mod
from harness.results import store as store_mod
from harness.report import outfile

DEFAULT_GOLDENS = Path("goldens")

DRIFT_EPILOG = """\
defaults and why:
  --baseline-runs 5  the median of 5 ignores up to 2 outlier runs and is a working week of
                     nightlies; a persistent step stays flagged until it is the new median
  --growth 4.0       4x (two binary orders of magnitude) is a change in numerics where a series
                     repeats run to run; one that does not (its baseline changed twice or
                     more: TE DelayedScaling) is judged by its group's median growth
  --fraction 0.5     still passing with 2x headroom: time to look before the nightly goes red
  --min-value 1e-12  growth from 0 to below this is rounding noise, not drift
Baselines only use runs of the same hardware key (device, GPU model, backend); the latest run
of each (hardware, scenario, backend) is judged. Tolerance-0 (bitwise) rows are not series:
they are 0 or already a failure. See docs/report.md.
"""


def _positive_int(s: str) -> int:
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return v


def _positive_float(s: str) -> float:
    v = float(s)
    if not v > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return v


def _history_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", type=Path, default=None, metavar="DIR",
                   help=f"the results store to read (default: ${store_mod.ENV}, else "
                        f"{store_mod.DEFAULT}); its history is DIR/history")
    p.add_argument("--history", type=Path, default=None, metavar="DIR",
                   help="directory of <run_id>.parquet files (default: the store's history)")


def history_path(args) -> Path:
    """``--history``, else the history of the results store (``--store``, $HARNESS_RESULTS,
    reports/)."""
    return args.history or store_mod.history_dir(store_mod.store_dir(args.store))


def _drift_args(p: argparse.ArgumentParser) -> None:
    d = drift_mod.DriftConfig()
    p.add_argument("--baseline-runs", type=_positive_int, default=d.baseline_runs, metavar="N",
                   help="baseline = median of the previous N runs (default: %(default)s)")
    p.add_argument("--growth", type=_positive_float, default=d.growth, metavar="K",
                   help="flag a metric that grew by more than K x its baseline "
                        "(default: %(default)s)")
    p.add_argument("--fraction", type=_positive_float, default=d.fraction, metavar="F",
                   help="flag a metric that crossed F x its tolerance (default: %(default)s)")
    p.add_argument("--min-value", type=float, default=d.min_value, metavar="V",
                   help="growth to values at or below V is never flagged (default: %(default)s)")


_positive_int.__name__ = "positive integer"  # argparse's "invalid <name> value: 'x'"
_positive_float.__name__ = "positive number"


def _config(args) -> drift_mod.DriftConfig:
    return drift_mod.DriftConfig(baseline_runs=args.baseline_runs, growth=args.growth,
                                 fraction=args.fraction, min_value=args.min_value)


def load_history(path: Path, complete_only: bool = False) -> history_mod.History | None:
    """The history, with skipped files on stderr; None (after a message) when nothing is usable.
    ``complete_only``: without interrupted runs (each named on stderr)."""
    if path.exists() and not path.is_dir():
        print(f"error: --history {path}: not a directory (a history is a directory of "
              f"<run_id>.parquet files)", file=sys.stderr)
        return None
    if not path.is_dir():
        print(f"error: history directory {path} does not exist (run a scenario first: "
              f"pytest --scenario smoke)", file=sys.stderr)
        return None
    h = history_mod.load(path, complete_only=complete_only)
    for line in history_mod.format_problems(h.problems):
        print(f"warning: {line}", file=sys.stderr)
    for line in history_mod.format_interrupted(h):
        print(f"note: {line}", file=sys.stderr)
    if h.empty:
        print(f"error: no usable runs in {path} (run a scenario first: pytest --scenario smoke)",
              file=sys.stderr)
        return None
    return h


# ---- report ----
def report_args(p):
    _history_arg(p)
    p.add_argument("--out", type=Path, default=None, metavar="FILE",
                   help="the HTML file to write (default: report.html in the results store)")
    p.add_argument("--registry", type=Path, default=None, metavar="FILE",
                   help="xfail registry for the ledger (default: the one the latest run used, "
                        "else scenarios/xfails.yaml)")
    p.add_argument("--title", default="Distributed correctness report")
    _drift_args(p)


def report(args) -> int:
    from harness.report import html
    out = args.out or store_mod.store_dir(args.store) / "report.html"
    try:
        outfile.check("--out", out)  # before the rendering, not after it
    except outfile.OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    h = load_history(history_path(args))
    if h is None:
        return 2
    reg = args.registry if args.registry is not None else html.default_registry(h)
    text = html.render(h, _config(args), reg, title=args.title)
    try:
        outfile.write_text("--out", out, text)
    except outfile.OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({len(text.encode()) // 1024} KiB): {len(h.runs)} run(s), latest "
          f"{h.latest['run_id']}" + (f"; skipped {len(h.problems)} file(s)" if h.problems else ""))
    return 0


# ---- drift ----
def drift_cmd_args(p):
    _history_arg(p)
    _drift_args(p)
    p.add_argument("--at", metavar="RUN_ID", default=None,
                   help="judge the history as it was right after this run (default: latest)")
    p.add_argument("--fail-on-drift", action="store_true",
                   help="exit 1 when anything is flagged (for CI)")


def drift(args) -> int:
    h = load_history(history_path(args), complete_only=True)  # a stopped run is no latest value
    if h is None:
        return 2
    cfg = _config(args)
    why = drift_mod.unusable_latest(h) if args.at is None else None
    if why:  # never judge an older run in place of a corrupt latest one
        print(f"error: {why}", file=sys.stderr)
        return 2
    try:
        res = drift_mod.detect(h, cfg, at=args.at)
    except KeyError as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    print(cfg.describe())
    for g in res.groups.itertuples(index=False):
        print(f"  {g.scenario} ({g.backend}) on {g.hw}: latest run {g.latest_run}, "
              f"{g.baseline_runs} baseline run(s)")
    for n in res.notes:
        print(f"note: {n}")
    judged = int((res.latest["base_n"] >= 1).sum()) if len(res.latest) else 0
    print(f"{len(res.latest)} series in the latest runs, {judged} with a baseline (judged); "
          f"{len(res.flags)} flagged")
    print(drift_mod.format_flags(res))
    if res.flagged and args.fail_on_drift:
        print("drift flagged: failing (--fail-on-drift)", file=sys.stderr)
        return 1
    return 0


# ---- goldens ----
def goldens_args(p):
    _history_arg(p)
    p.add_argument("--goldens", type=Path, default=DEFAULT_GOLDENS, metavar="DIR",
                   help="directory of <key>.json golden files (default: %(default)s)")
    p.add_argument("--run", metavar="RUN_ID", default=None,
                   help="compare this run (default: the latest)")
    p.add_argument("--update-goldens", action="store_true",
                   help="rewrite the golden file of this hardware + software key from the run "
                        "and print what changed (never done without this flag)")


def goldens(args) -> int:
    h = load_history(history_path(args))
    if h is None:
        return 2
    try:
        return goldens_mod.run(h, args.goldens, args.update_goldens, args.run)
    except KeyError as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
