"""What killed runs left: their temporary directories (``launch.scratch``: work dirs with
checkpoints, in /dev/shm by default, and launches' TMPDIRs) are removed when a later run starts,
and the run says so in one line, e.g.::

    harness: removed 3 temporary directories left in /dev/shm, /tmp by runs that were killed
    (pids 4242; 12.5 MiB)

Before, a SIGKILLed pytest's ``/dev/shm/harness-<run>-*`` stayed for ever (RAM on a GPU box).
"""

from __future__ import annotations

import pytest

from harness.launch import scratch


class _Note:
    def __init__(self, line: str):
        self.line = line

    @pytest.hookimpl(trylast=True)  # after the session header
    def pytest_sessionstart(self, session) -> None:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.write_line(self.line)


def sweep(config, work_dir: str | None) -> str:
    """Remove the leftovers of dead runs where this run puts its temporary directories; the
    line that says so is printed as the session starts."""
    line = scratch.sweep(scratch.parents(work_dir))
    if line:
        config.pluginmanager.register(_Note(line), "harness-leftovers")
    return line
