"""What every section reads: the history, its run groups, the drift result and the anchors.

A *group* is one (hardware, scenario, backend): the outcome matrix, the coverage tables, fix
verification and "what changed" each show the latest run of every group. *Anchors* are the ids
of the matrix cells and their cases: the matrix registers them, the other sections link a case
only when it has one (a case of an older run has no details block to jump to).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness.report import drift as drift_mod
from harness.report.history import History


class Ids:
    """Stable, HTML-safe anchors for arbitrary keys: prefix + order of first use."""

    def __init__(self, prefix: str):
        self.prefix, self.ids = prefix, {}

    def __call__(self, key) -> str:
        if key not in self.ids:
            self.ids[key] = f"{self.prefix}{len(self.ids) + 1}"
        return self.ids[key]

    def get(self, key) -> str | None:
        return self.ids.get(key)


@dataclass
class Group:
    hw: str
    scenario: str
    backend: str
    runs: list[int]  # run_index of the runs containing this group, oldest first

    @property
    def label(self) -> str:
        device, gpu, _, shared = (self.hw.split("/") + ["", "", "", ""])[:4]
        where = device + (f" · {gpu}" if gpu and gpu != "-" else "")
        if shared:  # ranks sharing GPUs over gloo (history.hardware_key): never pooled
            where += f" · {shared.replace('gloo-shared-x', 'gloo, ranks sharing GPUs, ')} a GPU"
        return f"{self.scenario} · {self.backend} · {where}"


def groups(h: History) -> list[Group]:
    g = drift_mod.run_groups(h)
    out = [Group(r.hw, r.scenario, r.backend, list(r.runs)) for r in g.itertuples(index=False)]
    # most recent first, then by name
    return sorted(out, key=lambda x: (-x.runs[-1], x.scenario, x.hw))


def axes(s: str) -> dict:
    """The JSON ``axes`` column of a row -> dict ({} when it does not parse)."""
    try:
        d = json.loads(s)
        return d if isinstance(d, dict) else {}
    except (TypeError, ValueError):
        return {}


def coord(v) -> str:
    """An axis value as a matrix coordinate (missing -> '—')."""
    return str(v) if v not in (None, "") else "—"


class ReportContext:
    """The inputs of every section, computed once: history, groups, drift, anchors."""

    def __init__(self, h: History, cfg: drift_mod.DriftConfig, registry_path: Path | None):
        self.h, self.cfg, self.registry_path = h, cfg, registry_path
        self.groups = groups(h)
        self.drift = drift_mod.detect(h, cfg)
        self.cell_id = Ids("cell-")
        self.case_id = Ids("case-")
        self._rows: dict[tuple, pd.DataFrame] = {}

    def rows(self, g: Group, run_index: int | None = None) -> pd.DataFrame:
        """Every row of group ``g`` in one run (default: its latest)."""
        ri = g.runs[-1] if run_index is None else run_index
        key = (g.hw, g.scenario, g.backend, ri)
        if key not in self._rows:
            r = self.h.rows
            self._rows[key] = r[(r["run_index"] == ri) & (r["hw"] == g.hw)
                                & (r["scenario"] == g.scenario) & (r["backend"] == g.backend)]
        return self._rows[key]

    def run(self, run_index: int) -> pd.Series:
        return self.h.runs.iloc[run_index]

    def case_ref(self, case: str, hw: str, backend: str) -> dict:
        """A case to show: its id and the anchor of its details block (None: not linked)."""
        return {"case": case, "anchor": self.case_id.get((hw, backend, case))}
