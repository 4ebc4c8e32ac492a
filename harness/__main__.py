"""``python -m harness COMMAND``: tools over the results history (``reports/history``).

    python -m harness report  [--history DIR] [--out FILE]     # self-contained HTML report
    python -m harness drift   [--history DIR] [--fail-on-drift] # tolerance drift, for CI
    python -m harness goldens [--history DIR] [--goldens DIR] [--update-goldens]

Scenarios themselves run under pytest: ``pytest --scenario NAME``. To add a subcommand, put its
logic under ``harness/`` and append a :class:`harness.report.cli.Command` to ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import sys

from .report import cli

COMMANDS: list[cli.Command] = [*cli.COMMANDS]


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
