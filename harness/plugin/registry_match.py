"""The xfail registry applied to a run: each case's matching entries, the workarounds they
name, the strict xfail marker, and the warning for entries no case of the run matched."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from harness.plugin.failure_text import CaseFailed
from harness.verdict import registry
from harness.worker.workarounds import WORKAROUNDS


def workarounds(entries: list[registry.Entry]) -> tuple[tuple[str, str], ...]:
    """(unit, workaround) for each failing unit an entry's workaround can stand in for."""
    return tuple((f.check, e.workaround) for e in entries if e.workaround
                 for f in e.fails if f.check in WORKAROUNDS[e.workaround].units)


class RegistryMatch:
    """The loaded ``registry`` and what matching it does to a run's case items."""

    def __init__(self, reg: registry.Registry):
        self.registry = reg

    @property
    def path(self):
        return self.registry.path

    def apply(self, item, device: str, env: dict) -> None:
        """Give ``item`` its entries, the case its workarounds and the strict xfail marker;
        a registry error is a usage error."""
        from harness.worker.runner import planned_units  # imports torch: at collection only
        try:
            entries = self.registry.match(item.case, device, env, planned_units(item.case))
            item.clean_entries = self.registry.clean_twin_entries(item.case, device, env)
        except registry.RegistryError as e:
            raise pytest.UsageError(str(e)) from None
        if entries:
            item.entries = entries
            item.case = dataclasses.replace(item.case, workarounds=workarounds(entries))
            item.add_marker(pytest.mark.xfail(
                reason=registry.xfail_reason(entries), strict=True,
                raises=CaseFailed))

    def warn_stale(self, collected: dict, backend: str, matrix: dict, device: str) -> None:
        """One short line for each entry of a scenario that ran that selects no case of its
        whole matrix (``matrix``: scenario -> all its cases; ``collected``: case id ->
        (outcome, info)). Entries whose cases were only deselected or skipped say nothing: a
        ``-k`` subset is quiet."""
        ran = {info["scenario"] for o, info in collected.values() if o != "skipped"}
        coords = [registry.coords(c, device) for cases in matrix.values() for c in cases]
        for e in self.registry.stale(ran, backend, coords):
            warnings.warn(pytest.PytestWarning(
                f"{e.label} selects no case of the scenarios it names ({_match_text(e)}); "
                f"remove it if the failure is gone for good"))


def _match_text(e: registry.Entry) -> str:
    return ", ".join(f"{k}: {'|'.join(v)}" for k, v in e.match.items())
