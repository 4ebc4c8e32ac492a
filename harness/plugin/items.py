"""The pytest nodes of a scenario run: a scenario file (:class:`ScenarioFile`) holds one
:class:`CaseItem` per case.

A case item asks the session's scheduler for its result, judges it against its xfail registry
entries (``verdict.judge``) and raises :class:`CaseFailed` (what a strict xfail marker expects)
or :class:`XfailMismatch` (registered, but failing another way). :meth:`CaseItem.info` is the
plain-data dict its test report carries (``report.harness``): rows, outcome, repro, launches.
"""

from __future__ import annotations

import pytest

from harness.launch.scheduler import CaseResult
from harness.plugin import disk_full
from harness.plugin.failure_text import CaseFailed, XfailMismatch, one_line
from harness.spec import catalog
from harness.spec.matrix import Case
from harness.verdict import judge as verdict_mod
from harness.verdict import registry

STASH = pytest.StashKey[object]()  # the run's HarnessSession (plugin/hooks.py)


class ScenarioFile(pytest.File):
    def collect(self):
        hs = self.config.stash[STASH]
        for case in hs.selection.cases[self.path.stem]:
            yield CaseItem.from_parent(self, name=case.id, case=case)


class CaseItem(pytest.Item):
    def __init__(self, *, case: Case, **kw):
        super().__init__(**kw)
        self.case = case
        self.result: CaseResult | None = None
        self.entries: list[registry.Entry] = []
        self.verdict: verdict_mod.Verdict | None = None
        # a case with a bug switched on: the entries of its clean twin, and what they miss
        self.clean_entries: list[registry.Entry] | None = None
        self.vs_clean: verdict_mod.Verdict | None = None
        self.skip_reason = ""
        self.add_marker("harness_case")
        for m in case.marks:  # scenario 'marks' (e.g. ci: the representative slice)
            self.add_marker(m)

    @property
    def hs(self):
        return self.config.stash[STASH]

    def runtest(self):
        try:
            self.result = res = self.hs.scheduler.result(self.case)
        except OSError as e:  # a lane could not write its launch's files: a full disk?
            full = disk_full.not_run(self.hs, self.case.id, e)
            if full is None:
                raise
            raise full from None
        if self.hs.on_demand is not None:  # rows no packaged population could judge
            self.hs.on_demand.resolve(self.case, res.rows, self.hs.scheduler)
        self.verdict = v = verdict_mod.judge(res.rows, res.status, res.errors, self.entries)
        if self.clean_entries is not None:
            self.vs_clean = verdict_mod.judge(res.rows, res.status, res.errors,
                                              self.clean_entries)
        if v.outcome in (verdict_mod.PASSED, verdict_mod.XPASSED):
            return  # XPASSED: the strict xfail marker makes pytest fail it ("remove entry N")
        text = self.hs.failure_text(self, res)
        full = disk_full.full_line(self.hs) if res.status != "ok" else ""
        if full:  # ranks that could not write their logs / results die without a word
            text = f"{self.case.id}: {full}\n{text}"
        if v.outcome == verdict_mod.XFAILED:
            raise CaseFailed(text)
        if self.entries:
            raise XfailMismatch(f"{v.message}\n{text}")
        raise CaseFailed(text)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, (CaseFailed, XfailMismatch, disk_full.NotRun)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, 0, self.name

    def info(self) -> dict:
        res, hs = self.result, self.hs
        out = dict(run_id=hs.run_id, case_id=self.case.id, case_key=self.case.key,
                   scenario=self.case.scenario, backend=self.case.backend, device=hs.device,
                   axes=[list(a) for a in self.case.axes], repro=hs.repro(self),
                   skip_reason=self.skip_reason,
                   xfail_entry=self.entries[0].number if self.entries else None,
                   xfail_entries=[e.number for e in self.entries],
                   xfail_reason=" | ".join(e.reason for e in self.entries))
        out["pg_backend"], out["ranks_per_gpu"] = hs.env.placement(self.case)
        out["loss"] = catalog.TASK_LOSS[self.case.task]  # its tolerances' population
        out["config"] = self.case.numerics  # ... and configuration
        if res is not None:  # plain data (xdist); the results stage makes the rows of it
            out.update(status=res.status, seconds=res.seconds, rows=res.rows,
                       launches=res.launches, summary=one_line(res))
        if self.verdict is not None:  # decided once, here; everything after reads it
            out.update(outcome=self.verdict.outcome,
                       coverage={u: list(c) for u, c in self.verdict.coverage.items()})
        if self.vs_clean is not None:
            out["vs_clean"] = self.vs_clean.unexplained
        out["launch_records"] = hs.record.pop_launch_records()
        return out


def of_world_size(items: list, only: int | None) -> tuple[list, list]:
    """(kept, dropped) items for ``--world-size only``: case items whose largest world size
    is not ``only`` are dropped; other items and, without the option, all are kept."""
    if not only:
        return items, []
    keep, dropped = [], []
    for i in items:
        (keep if not isinstance(i, CaseItem) or max(i.case.world_sizes) == only
         else dropped).append(i)
    return keep, dropped
