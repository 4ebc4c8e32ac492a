"""A test helper: which processes did a launch start? Sampled from /proc, independently of the
launcher's own bookkeeping (tests/test_no_leaks.py, tests/test_interrupt.py)."""

import json
import os
import threading
import time
from pathlib import Path

from harness.launch import procs


class Sampler:
    """Records, every 0.1 s, the descendants of ``roots`` (default: this process) and the pids
    the ranks write into their progress files under ``launches``."""

    def __init__(self, launches: Path, roots=None):
        self.launches = launches  # a directory of L### launch directories (may not exist yet)
        self.roots = list(roots or [os.getpid()])
        self.seen: dict[int, str] = {}  # pid -> cmdline when last seen
        self.names: dict[int, str] = {}  # pid -> process name (a forked rank names itself)
        self.ranks: set[int] = set()  # pids the ranks wrote (a rank may be gone before a sample)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self):
        pids = set(procs.descendants(self.roots))
        for f in self.launches.glob("**/L*/progress/rank*.json"):
            try:
                pid = int(json.loads(f.read_text())["pid"])
                pids.add(pid)
                self.ranks.add(pid)
            except (OSError, KeyError, TypeError, ValueError):  # being rewritten: next sample
                continue
        for pid in pids:  # the latest command line (a fresh fork still shows its parent's)
            line = procs.cmdline(pid)
            if line and procs.alive(pid):
                self.seen[pid] = line
                self.names[pid] = _comm(pid) or self.names.get(pid, "")

    def _run(self):
        while not self._stop.is_set():
            self._sample()
            time.sleep(0.1)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)

    def survivors(self) -> dict[int, str]:
        """Seen pids still alive with the same command line (a reused pid is not ours)."""
        return {p: c for p, c in self.seen.items() if procs.alive(p) and procs.cmdline(p) == c}


def _comm(pid: int) -> str:
    """A process's name (``set_name``), or "" when it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""
