"""DCP's process-based async stager, started once per worker ahead of its first use.

``dcp.async_save(..., async_checkpointer_type=PROCESS)`` spawns one stager process per rank on
its first call (a fresh Python that imports torch and joins a process group of its own: seconds)
and reuses it afterwards. When a launch's plan has such saves, the worker starts that process in
a background thread right after its process groups are up, so the spawn overlaps the first
cases instead of stalling the first async_process save. It uses DCP's own executor state
(``_async_process_executor``); if that private API is not there, nothing is pre-started and DCP
starts the process lazily as usual. Where the run's rank server can fork the stager (the
context the worker gives :func:`use`: ``worker/stager_fork.py``), DCP's constructor gets it in
place of ``multiprocessing``'s spawn context -- with the launch, or at the first async_process
save where the stager does not start with the launch (:func:`start`: CPU runs); where that
context cannot start the process, the stager is spawned as DCP does.
"""

from __future__ import annotations

import signal
import threading

_thread: threading.Thread | None = None
_error: list = []
_context = None  # the rank server's multiprocessing context for this rank's stager (use())


HOW: list = []  # how this rank's stager started: "forked" / "spawned (why)"


def use(context) -> None:
    """The context this rank's stager starts from (``worker/stager_fork.py``; None: DCP's
    spawn), whether it starts with the launch (:func:`prestart`) or at the first
    async_process save (:func:`start`)."""
    global _context
    _context = context


def start(group) -> None:
    """At an async_process save: where the rank server can fork the stager and none was
    started, start it now (collective over ``group``, as DCP's own first save is) -- else DCP
    would spawn a fresh Python that imports torch. Without a context DCP starts it as usual."""
    if _context is not None and _thread is None:
        prestart(group)


def prestart(group) -> bool:
    """Collective over ``group`` (the async-save group): agree on the stagers' rendezvous,
    then start this rank's stager in the background -- from the context :func:`use` set,
    where there is one (where it cannot start one it raises an ``OSError`` with
    ``no_process`` set: then spawned). Returns whether it was started."""
    global _thread
    try:
        from torch.distributed.checkpoint import _async_process_executor as ape
        if ape._CHECKPOINT_PROCESS is not None or not hasattr(ape, "_AsyncCheckpointProcess"):
            return False
        info = ape._ProcessGroupInitInfo(group)
    except Exception:  # noqa: BLE001 - private API changed: DCP starts it lazily
        return False

    def start_stager():
        why = ""
        try:
            if _context is not None and hasattr(ape, "mp"):
                try:
                    ape._CHECKPOINT_PROCESS = _construct(ape, info, _context)
                    HOW.append("forked")
                    return
                except OSError as e:
                    if not getattr(e, "no_process", False):
                        raise
                    why = f" ({e})"  # nothing was started: spawn it as DCP does
            ape._CHECKPOINT_PROCESS = ape._AsyncCheckpointProcess(pg_init_info=info)
            HOW.append("spawned" + why)
        except Exception as e:  # noqa: BLE001 - reported by wait(); DCP retries lazily
            _error.append(e)

    _thread = threading.Thread(target=start_stager, daemon=True, name="dcp-stager-prestart")
    _thread.start()
    return True


def _construct(ape, info, context):
    """DCP's stager object with ``context`` as the ``multiprocessing`` its constructor asks
    for its pipe and process (``mp.get_context("spawn")``); only this thread constructs one
    (``wait`` comes before any process-staged save)."""
    saved = ape.mp
    ape.mp = context
    try:
        return ape._AsyncCheckpointProcess(pg_init_info=info)
    finally:
        ape.mp = saved


def wait(timeout_s: float) -> None:
    """Before an async_process save: the pre-started stager is up (bounded)."""
    if _thread is not None and _thread.is_alive():
        _thread.join(timeout=timeout_s)
        if _thread.is_alive():
            raise TimeoutError(f"the DCP stager process did not start within {timeout_s:g} s")


# An async_process save failed or timed out: the stagers' own process group may be out of step
# (another rank's stager waits in a collective with a dead one), so this launch's stagers are
# not reused -- the worker exits after the task and the rest of the batch is re-launched.
BROKEN = False


def dead() -> str | None:
    """A one-line account of this rank's stager process if it has died, else None."""
    try:
        from torch.distributed.checkpoint import _async_process_executor as ape
        proc = ape._CHECKPOINT_PROCESS._save_process
    except Exception:  # noqa: BLE001 - none started, or the private API changed
        return None
    proc.join(timeout=5.0)  # its pipe closes a moment before it can be reaped
    if proc.is_alive():
        return None
    code = proc.exitcode
    how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 \
        else f"exit code {code}"
    import os
    return f"rank {os.environ.get('RANK', '?')}'s async_process stager process (pid {proc.pid}) " \
           f"died ({how})"


def stop() -> None:
    """End this rank's stager process (if one was started) before the rank exits: a stager
    left running makes torchrun's shutdown signal and wait for it (docs/performance.md,
    "Small costs")."""
    try:
        from torch.distributed.checkpoint import _async_process_executor as ape
        proc = ape._CHECKPOINT_PROCESS._save_process
    except Exception:  # noqa: BLE001 - none started, or the private API changed
        return
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=5.0)
