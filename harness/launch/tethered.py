"""``python -m harness.launch.tethered [--parent PID] MODULE ARGS...``: run ``python -m MODULE ARGS``
in this process, SIGKILLed by the kernel when its parent dies.

The launcher starts torchrun this way (``MODULE`` = ``torch.distributed.run``): if pytest is
killed outright (SIGKILL, a crashed pytest-xdist worker), its torchrun agents die with it, and
their ranks -- tethered to the agent the same way in worker/main.py -- die with them.
``--parent`` is the pid the caller expects as our parent (it may have died before the tether
held: then exit at once); a node launcher such as srun is not that parent, so it is left out
there. Children learn the pid to expect from ``HARNESS_PARENT_PID``.
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
