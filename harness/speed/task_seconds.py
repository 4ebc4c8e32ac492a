"""The seconds each task took in the last run on this checkout, kept in pytest's cache
(``.pytest_cache``, the cache provider's ``config.cache``; nothing without it, e.g.
``-p no:cacheprovider``): the scheduler weighs a module's work left by them and the launcher
gives a costly module more lanes (speed/lane_choice.py). A hint
for the order of the tasks only: no case's outcome depends on it. One entry per device type
(CPU and GPU runs of one checkout take very different times)."""

from __future__ import annotations

KEY = "harness/task-seconds/{device}"


def load(config, device: str) -> dict[str, float]:
    cache = getattr(config, "cache", None)
    if cache is None:
        return {}
    got = cache.get(KEY.format(device=device), {})
    if not isinstance(got, dict):
        return {}
    return {str(k): float(v) for k, v in got.items() if isinstance(v, (int, float)) and v > 0}


def store(config, device: str, measured: dict[str, float]) -> None:
    """Merge ``measured`` (task name -> seconds) into the cache: tasks this run did not run keep
    their last time."""
    cache = getattr(config, "cache", None)
    if cache is None or not measured:
        return
    merged = {**load(config, device), **{k: round(float(v), 3) for k, v in measured.items()}}
    cache.set(KEY.format(device=device), merged)
