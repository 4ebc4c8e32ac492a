"""``python -m harness.launch.tethered [--parent PID] MODULE ARGS...``: run ``python -m MODULE
ARGS`` in this process, SIGKILLed by the kernel when its parent dies: the launcher starts
torchrun this way, so a killed pytest takes its agents (and their tethered ranks) with it.
``--parent``: the pid expected as parent (gone before the tether held: exit at once).
"""

from __future__ import annotations

import os
import runpy
import sys

from harness.worker import tether


def main(argv: list[str]) -> None:
    parent = None
    if argv[:1] == ["--parent"]:
        parent, argv = int(argv[1]), argv[2:]
    if not argv:
        sys.exit("usage: python -m harness.launch.tethered [--parent PID] MODULE [ARGS...]")
    tether.tether(parent)
    os.environ[tether.PARENT_VAR] = str(os.getpid())  # what our children must see as parent
    module, sys.argv = argv[0], [argv[0]] + argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
