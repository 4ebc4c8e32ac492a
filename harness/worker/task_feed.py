"""The tasks a launch runs, in order: the plan's, then those fed while it lives. The launcher
writes ``queue/000001.json``, ... (atomically) and, when it will feed no more, ``queue/closed``
holding how many there are; every rank reads the same files in the same order. Waiting is
bounded (``idle_timeout_s``), and the rank is tethered to torchrun, torchrun to pytest.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Iterator

POLL_S = 0.02  # how often a waiting rank looks for the next queue file, at first
IDLE_POLL_S = 0.2  # ... and after waiting a while (why: docs/performance.md, "Small costs")


def tasks(root: Path, plan: dict, on_idle: Callable[[], None] = lambda: None) -> Iterator[dict]:
    """Yield the plan's tasks, then each fed task as it arrives, until the feed is closed and
    drained (or stayed empty for ``plan['idle_timeout_s']``). ``on_idle`` is called once each
    time the rank starts waiting."""
    yield from plan["tasks"]
    queue = root / "queue"
    n, idle_since, poll = 1, None, POLL_S
    limit = float(plan.get("idle_timeout_s", 3600.0))
    while True:
        f = queue / f"{n:06d}.json"
        if f.is_file():
            batch = json.loads(f.read_text())
            n, idle_since, poll = n + 1, None, POLL_S
            yield from batch
            continue
        closed = _closed(queue)
        if closed is not None and closed < n:
            return
        if idle_since is None:
            idle_since = time.monotonic()
            on_idle()
        elif time.monotonic() - idle_since > limit:
            print(f"no task fed for {limit:g} s: ending this launch", flush=True)
            return
        time.sleep(poll)
        poll = min(IDLE_POLL_S, poll * 2)  # 0.02, 0.04, ... 0.2 s: longer the longer it waits


def _closed(queue: Path) -> int | None:
    """How many queue files the launcher wrote, once it has closed the feed."""
    try:
        return int((queue / "closed").read_text())
    except (OSError, ValueError):
        return None
