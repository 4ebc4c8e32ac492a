"""A test helper: the rank server (harness/launch/rank_server.py) for tests whose launches check
what a case computes, not how its processes start. A fresh rank imports torch, DCP and the
harness itself (~3 CPU-seconds a rank on the 2-core CI machine); a forked one imports nothing.
Forked and fresh ranks give the same results to the bit (tests/test_rank_server.py); the
fresh path keeps its own tests (test_no_leaks, test_interrupt, test_accelerations' plain
path, ...). One server per process: :func:`rank_server` starts it for
the block and stops it after."""

import contextlib

from harness.launch.launch import run_env
from harness.launch.rank_server import RankServer

# for a ``pytest --scenario`` subprocess: its ranks fork from its own rank server
FORK = ("--rank-start", "fork")


@contextlib.contextmanager
def rank_server(backend: str):
    """A started rank server of ``backend`` on CPU for the block (stopped after it)."""
    server = RankServer(backend, run_env("cpu", {})).start()
    try:
        yield server
    finally:
        server.stop()
