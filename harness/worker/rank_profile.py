"""A rank's cProfile and CPU seconds, when ``HARNESS_PROFILE_DIR`` is set (e.g. around ``python
-m harness bench``): each rank writes ``<launch>-rank<R>.prof`` and ``.cpu.json`` there."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

PROFILE_VAR = "HARNESS_PROFILE_DIR"  # set: each rank writes a cProfile of its run there


def start():
    """A running cProfile when ``HARNESS_PROFILE_DIR`` is set, else None."""
    if not os.environ.get(PROFILE_VAR):
        return None
    import cProfile
    Path(os.environ[PROFILE_VAR]).mkdir(parents=True, exist_ok=True)
    prof = cProfile.Profile()
    prof.enable()
    return prof


def finish(prof, launch: str, rank: int, t_main: float) -> None:
    """Write the profile and the rank's CPU seconds (all its threads) beside its wall clock."""
    if prof is None:
        return
    prof.disable()
    stem = Path(os.environ[PROFILE_VAR]) / f"{launch}-rank{rank}"
    prof.dump_stats(f"{stem}.prof")
    import resource
    use = resource.getrusage(resource.RUSAGE_SELF)
    Path(f"{stem}.cpu.json").write_text(json.dumps(dict(
        user_s=use.ru_utime, sys_s=use.ru_stime, wall_s=time.time() - t_main), indent=1))
