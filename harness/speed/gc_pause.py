"""The pytest process's garbage collector over a run: paused while the plugin imports torch and
the backend and collects the cases, then everything alive is frozen (``gc.freeze``) and
collection resumes.

Why: a Python that imported torch and TE holds millions of objects that every full
``gc.collect()`` walks, and its exit walks them again; frozen, neither does -- pytest itself
runs two collections at its end (``unraisableexception``), and the lanes' threads live in this
process. Frozen objects
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
