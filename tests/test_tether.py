"""worker/tether.die_with: a process that is not the other's child exits when it ends -- what
keeps a forked DCP stager from outliving its rank (worker/stager_fork.py)."""

import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

CHILD = """
import os, sys, time
from harness.worker import tether
if sys.argv[2] == "nopidfd":
    del os.pidfd_open  # Linux < 5.3: the 0.2 s look
tether.die_with(int(sys.argv[1]))
print("watching", flush=True)
time.sleep(60)
"""


def _watcher(pid: int, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(pid), mode],
                            stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize("mode", ["pidfd", "nopidfd"])
def test_exits_when_the_watched_process_ends(mode):
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    watcher = _watcher(target.pid, mode)
    try:
        assert watcher.stdout.readline().strip() == "watching"
        time.sleep(0.3)
        assert watcher.poll() is None  # alive while the watched process is
        target.kill()
        target.wait(timeout=10)
        t0 = time.monotonic()
        assert watcher.wait(timeout=10) == 1
        assert time.monotonic() - t0 < 2.0
    finally:
        for p in (target, watcher):
            p.kill()
            p.wait(timeout=10)


@pytest.mark.parametrize("mode", ["pidfd", "nopidfd"])
def test_a_process_already_gone_ends_the_watcher_at_once(mode):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    watcher = _watcher(gone.pid, mode)
    try:
        assert watcher.wait(timeout=30) == 1
        assert "watching" not in watcher.stdout.read()
    finally:
        watcher.kill()
        watcher.wait(timeout=10)
