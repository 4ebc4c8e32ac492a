"""What a lane's launches take their tasks from and hand their results to: a queue each way.
The scheduler puts tasks into a lane's :class:`Feed` and closes it when nothing more can come;
the launches take them (``wait``: a new launch's first tasks, None once closed; ``poll``: tasks
put since the last look, [] for none, None once closed) and post what they finish
(``finished``) or leave (``requeue``) on the scheduler's event queue. Neither side calls into
the other. :class:`FixedFeed`: a fixed list of tasks (``Launcher.run_batch``).
"""

from __future__ import annotations

import queue
import threading

from harness.launch.tasks import Task, TaskResult

WAIT_S = 0.5  # how often a waiting lane looks at the stop flag


class Feed:
    """One lane's queue. ``events`` is the scheduler's: ("finished", lane, results),
    ("requeue", lane, tasks) and ("end", lane, error) arrive there, tagged with ``lane``."""

    def __init__(self, lane, events: queue.Queue, timeout_s: float):
        self.lane, self.events, self.timeout_s = lane, events, timeout_s
        self._tasks: queue.Queue = queue.Queue()
        self._closed = False  # the close marker was taken (lane side)

    # -- the scheduler's side ----------------------------------------------------------------
    def put(self, tasks: list[Task]) -> None:
        self._tasks.put(list(tasks))

    def close(self) -> None:
        self._tasks.put(None)

    # -- the lane's side ---------------------------------------------------------------------
    def wait(self, stop: threading.Event) -> list[Task] | None:
        if self._closed:
            return None
        while not stop.is_set():
            try:
                got = self._tasks.get(timeout=WAIT_S)
            except queue.Empty:
                continue
            if got is None:
                self._closed = True
            return got
        return None

    def poll(self) -> list[Task] | None:
        out: list[Task] = []
        while not self._closed:
            try:
                got = self._tasks.get_nowait()
            except queue.Empty:
                return out
            if got is None:
                self._closed = True
            else:
                out += got
        return out or None

    def finished(self, results: dict[str, TaskResult]) -> None:
        self.events.put(("finished", self.lane, results))

    def requeue(self, tasks: list[Task]) -> None:
        self.events.put(("requeue", self.lane, tasks))

    def ended(self, error: BaseException | None) -> None:
        """The lane's thread is done (``error``: what ended it, else None)."""
        self.events.put(("end", self.lane, error))


class FixedFeed:
    """A fixed list of tasks: all of them for the first launch, the unfinished ones again after
    a timeout or crash, nothing fed while a launch runs."""

    def __init__(self, tasks: list[Task]):
        self.left, self.results = list(tasks), {}
        self.timeout_s = max((t.case.timeout_s for t in tasks), default=0.0)

    def wait(self, stop: threading.Event) -> list[Task] | None:
        out, self.left = self.left, []
        return out or None

    def poll(self) -> None:
        return None

    def finished(self, results: dict[str, TaskResult]) -> None:
        self.results.update(results)

    def requeue(self, tasks: list[Task]) -> None:
        self.left = [t for t in tasks if t.name not in self.results]
