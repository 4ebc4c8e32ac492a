"""``python -m harness COMMAND``: tools over a results store's history (``--store DIR``,
``$HARNESS_RESULTS``, else ``reports/``: harness/results/store.py).

    python -m harness report  [--store DIR] [--out FILE]       # self-contained HTML report
    python -m harness drift   [--store DIR] [--fail-on-drift]   # tolerance drift, for CI
    python -m harness goldens [--history DIR] [--goldens DIR] [--update-goldens]
    python -m harness calibrate [--run] [--history DIR]         # measured errors -> tolerances
    python -m harness bench --label NAME -- PYTEST_ARGS        # where the time goes
    python -m harness ab --a JSON... --b JSON...               # a speed change: kept or not
    python -m harness rejudge --history DIR [--registry FILE]   # recorded runs vs the registry now
    python -m harness compare --a DIR_OR_PARQUET --b DIR_OR_PARQUET  # two runs, case by case

Scenarios themselves run under pytest: ``pytest --scenario NAME``. To add a subcommand, put its
logic under ``harness/`` and append a :class:`Command` to ``COMMANDS`` (the one list).

Bad input is one line on stderr and exit status 2, whatever the command: a bad option
(argparse's usage text is left out: ``--help`` has it), an ``--out`` FILE that is a directory
or under a file (checked before the command's work), and any file the command cannot read or
write, or a registry / scenario / history file it cannot use (OSError, decode errors and the
stages' own errors, caught here rather than shown as tracebacks).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable

from pathlib import Path

from harness.calibration import command as calibration_command
from harness.report import ab, bench, cli, compare, outfile, rejudge
from harness.report.history import HistoryError
from harness.spec.base import ScenarioError
from harness.verdict.registry import RegistryError

# errors of bad input (files, their contents): one line and exit 2, never a traceback
USER_ERRORS = (OSError, UnicodeError, RegistryError, ScenarioError, HistoryError,
               outfile.OutputError, ab.BenchError)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (its usage text stays with --help)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


@dataclass
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    epilog: str | None = None
    out_file: bool = False  # its --out names a file (checked before it runs)

    def register(self, sub) -> None:
        p = sub.add_parser(self.name, help=self.help, description=self.help, epilog=self.epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        self.add_arguments(p)
        p.set_defaults(func=self.run)


COMMANDS: list[Command] = [
    Command("report", "write the self-contained HTML report of a results history",
            cli.report_args, cli.report, out_file=True),
    Command("drift", "flag metrics of the latest run that drift towards their tolerance",
            cli.drift_cmd_args, cli.drift, epilog=cli.DRIFT_EPILOG),
    Command("goldens", "compare the latest run's per-step losses bit for bit with pinned "
                       "goldens (or --update-goldens)", cli.goldens_args, cli.goldens),
    Command("calibrate", "regenerate harness/calibration/measured.csv (the measured errors "
                "tolerances are derived from) from calibration runs",
                calibration_command.add_arguments, calibration_command.run, out_file=True),
    Command("bench", "run pytest on scenarios and show where the time goes: launch "
                "phases, seconds per producer and check, checked cases per GPU-minute",
                bench.add_arguments, bench.run),
    Command("ab", "judge a speed change by bench runs without (--a) and with it (--b), "
                "measured alternately on one machine: exit 0 where it gains >= 10% with the "
                "same outcomes (docs/performance.md's rule), else 1", ab.add_arguments, ab.run),
    Command("rejudge", "judge recorded runs again against the xfail registry as it is "
                "now: which verdicts an edit changes, and the margin of every sized failure",
                rejudge.add_arguments, rejudge.run),
    Command("compare", "compare two recorded runs case by case (e.g. 2 GPUs over nccl vs "
                "one GPU shared over gloo): outcome, xfail entry, skip reason; exit 1 when "
                "some case differs", compare.add_arguments, compare.run, out_file=True),
]


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="python -m harness",
        description="Results history tools of the FSDP2 x TP x DCP correctness harness "
                    "(scenarios run under pytest: pytest --scenario NAME).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in COMMANDS:
        cmd.register(sub)
    args = parser.parse_args(argv)
    try:
        if getattr(args, "out", None) is not None and \
                any(c.out_file and c.name == args.command for c in COMMANDS):
            outfile.check("--out", Path(args.out))
        return args.func(args)
    except USER_ERRORS as e:
        print(f"python -m harness {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2


def _one_line(e: BaseException) -> str:
    """The error on one line; an OSError with the file it is about."""
    if isinstance(e, OSError) and e.filename is not None:
        return f"{e.filename}: {e.strerror or e}"
    if isinstance(e, UnicodeDecodeError):
        return f"not a text file ({e.reason} at byte {e.start})"
    return " ".join(str(e).split()) or type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
