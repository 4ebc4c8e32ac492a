"""The pytest process's garbage collector over a run: paused while the plugin imports torch and
the backend and collects the cases, then everything alive is frozen (``gc.freeze``) and
collection resumes.

Measured on one H100 with TE 2.20.2 (2026-11-26): a Python that imported torch and TE takes
1.11-1.39 s from its last ``atexit`` handler to its end, 0.42 s when its objects were frozen;
each full ``gc.collect()`` takes 0.17-0.21 s with them, 0 frozen -- pytest itself runs two at
its end (``unraisableexception``), and the lanes' threads live in this process. Frozen objects
are never collected: what the imports and the collection made lives until the process ends,
as it would anyway.
"""

from __future__ import annotations

import gc

_paused: list[bool] = []  # whether the collector was enabled when pause() disabled it


def pause() -> None:
    """Stop automatic collections until :func:`settle` (nearly every object the plugin's
    imports and collection make stays alive: collecting them only walks them)."""
    if not _paused:
        _paused.append(gc.isenabled())
        gc.disable()


def settle() -> None:
    """Freeze what is alive now and let the collector run again as it did before
    :func:`pause` (no-op without a pause)."""
    if _paused:
        gc.freeze()
        if _paused.pop():
            gc.enable()
