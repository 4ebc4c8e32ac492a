"""``python -m harness COMMAND``: tools over a results store's history (``--store DIR``,
``$HARNESS_RESULTS``, else ``reports/``: harness/results/store.py).

    python -m harness report  [--store DIR] [--out FILE]       # self-contained HTML report
    python -m harness drift   [--store DIR] [--fail-on-drift]   # tolerance drift, for CI
    python -m harness goldens [--history DIR] [--goldens DIR] [--update-goldens]
    python -m harness calibrate [--run] [--history DIR]         # measured errors -> tolerances
    python -m harness bench --label NAME -- PYTEST_ARGS        # where the time goes
    python -m harness rejudge --history DIR [--registry FILE]   # recorded runs vs the registry now

Scenarios themselves run under pytest: ``pytest --scenario NAME``. To add a subcommand, put its
logic under ``harness/`` and append a :class:`Command` to ``COMMANDS`` (the one list).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable

from harness.calibration import command as calibration_command
from harness.report import bench, cli, rejudge


@dataclass
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    epilog: str | None = None

    def register(self, sub) -> None:
        p = sub.add_parser(self.name, help=self.help, description=self.help, epilog=self.epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        self.add_arguments(p)
        p.set_defaults(func=self.run)


COMMANDS: list[Command] = [
    Command("report", "write the self-contained HTML report of a results history",
            cli.report_args, cli.report),
    Command("drift", "flag metrics of the latest run that drift towards their tolerance",
            cli.drift_cmd_args, cli.drift, epilog=cli.DRIFT_EPILOG),
    Command("goldens", "compare the latest run's per-step losses bit for bit with pinned "
                       "goldens (or --update-goldens)", cli.goldens_args, cli.goldens),
    Command("calibrate", "regenerate harness/calibration/measured.csv (the measured errors "
                "tolerances are derived from) from calibration runs",
                calibration_command.add_arguments, calibration_command.run),
    Command("bench", "run pytest on scenarios and show where the time goes: launch "
                "phases, seconds per producer and check, checked cases per GPU-minute",
                bench.add_arguments, bench.run),
    Command("rejudge", "judge recorded runs again against the xfail registry as it is "
                "now: which verdicts an edit changes, and the margin of every sized failure",
                rejudge.add_arguments, rejudge.run),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness",
        description="Results history tools of the FSDP2 x TP x DCP correctness harness "
                    "(scenarios run under pytest: pytest --scenario NAME).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in COMMANDS:
        cmd.register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
