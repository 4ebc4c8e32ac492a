"""DCP's process-based async stager, started once per worker ahead of its first use.

``dcp.async_save(..., async_checkpointer_type=PROCESS)`` spawns one stager process per rank on
its first call (a fresh Python that imports torch and joins a process group of its own: seconds)
and reuses it afterwards. When a launch's plan has such saves, the worker starts that process in
a background thread right after its process groups are up, so the spawn overlaps the first
cases instead of stalling the first async_process save. It uses DCP's own executor state
(``_async_process_executor``); if that private API is not there, nothing is pre-started and DCP
starts the process lazily as usual.
"""

from __future__ import annotations

import threading

_thread: threading.Thread | None = None
_error: list = []


def prestart(group) -> bool:
    """Collective over ``group`` (the async-save group): agree on the stagers' rendezvous,
    then spawn this rank's stager in the background. Returns whether it was started."""
    global _thread
    try:
        from torch.distributed.checkpoint import _async_process_executor as ape
        if ape._CHECKPOINT_PROCESS is not None or not hasattr(ape, "_AsyncCheckpointProcess"):
            return False
        info = ape._ProcessGroupInitInfo(group)
    except Exception:  # noqa: BLE001 - private API changed: DCP starts it lazily
        return False

    def start():
        try:
            ape._CHECKPOINT_PROCESS = ape._AsyncCheckpointProcess(pg_init_info=info)
        except Exception as e:  # noqa: BLE001 - reported by wait(); DCP retries lazily
            _error.append(e)

    _thread = threading.Thread(target=start, daemon=True, name="dcp-stager-prestart")
    _thread.start()
    return True


def wait(timeout_s: float) -> None:
    """Before an async_process save: the pre-started stager is up (bounded)."""
    if _thread is not None and _thread.is_alive():
        _thread.join(timeout=timeout_s)
        if _thread.is_alive():
            raise TimeoutError(f"the DCP stager process did not start within {timeout_s:.0f}s")
