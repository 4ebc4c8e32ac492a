"""One pytest run (or one xdist worker): :class:`HarnessSession` connects the parts, each in
its module -- ``selection`` (scenarios -> cases), ``environment`` (device, versions, GPUs),
``registry_match`` (xfail entries per case), ``execution`` (work dir, launcher, scheduler),
``failure_text`` (failure text, repro), ``results.run_record`` (outcomes, reports, terminal
summary) and ``items`` (the pytest nodes) -- and holds the hooks that need the run's state.

Running: at collection's end the :class:`Scheduler` starts a lane per world size and GPU slot;
each item then waits for its own result. Rows travel on the test report (``report.harness``),
so with xdist the controller gets them too; at session end they are written to the results
store (``harness/results/store.py``) and summarized in the terminal.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest

from harness.launch import interrupt
from harness.launch.case_result import CaseResult
from harness.plugin import interrupted, leftovers, options
from harness.plugin.environment import RunEnvironment
from harness.plugin.execution import Execution, execution_meta, scope_of
from harness.plugin.failure_text import FailureFormatter
from harness.plugin.items import CaseItem, of_world_size
from harness.plugin.on_demand import OnDemand, cancel_after_timeout, siblings, summary
from harness.plugin.registry_match import RegistryMatch
from harness.plugin.selection import ScenarioSelection, project_root
from harness.results import store
from harness.results import write as results
from harness.results.run_record import RunRecord
from harness.spec.matrix import Case
from harness.speed import gc_pause
from harness.verdict import registry_file


class HarnessSession:
    """One pytest run (or one xdist worker): its parts, and the hooks that connect them.

    ``selection`` (ScenarioSelection: scenarios, cases, backend), ``env`` (RunEnvironment:
    device, versions, GPUs), ``xfails`` (RegistryMatch), ``failures`` (FailureFormatter),
    ``record`` (RunRecord: outcomes, launch records, reports, terminal summary) and, once
    collection found runnable cases, ``execution`` (work dir, launcher, scheduler).
    """

    def __init__(self, config, names: list[str]):
        self.config = config
        t0 = time.time()
        here = Path(config.invocation_params.dir)
        self.root = root = project_root(config)
        self.selection = sel = ScenarioSelection(
            Path(config.getoption("scenario_dir") or root / "scenarios"), names,
            config.getoption("backend"), config.getoption("case_timeout"))
        for mark, file_name in sel.marks:
            config.addinivalue_line("markers", f"{mark}: scenario mark (see {file_name})")
        self.env = RunEnvironment(sel.backend, config.getoption("device"),
                                  config.getoption("max_world_size"),
                                  config.getoption("gpu_share"))
        self.backend, self.device = sel.backend, self.env.device
        given = config.getoption("xfail_registry")  # given: it must exist; the default may not
        reg_path = Path(given or sel.scenario_dir / "xfails.yaml")
        self.xfails = RegistryMatch(registry_file.load(reg_path, sel.known_axes() | {"fault"},
                                                  missing_ok=not given))
        winput = getattr(config, "workerinput", None)
        self.worker_id = winput["workerid"] if winput else None
        self.run_id = (winput.get("harness_run_id") if winput else None) or results.new_run_id()
        # absolute: launches run with their own working directory
        report_dir = store.run_store(config.getoption("report_dir"), root, here).resolve()
        if not config.getoption("collectonly") and self.worker_id is None:
            options.check_dirs(report_dir, config.getoption("work_dir"))  # room, access
            leftovers.sweep(config, config.getoption("work_dir"))  # what killed runs left
        self.record = RunRecord(t0, report_dir, not config.getoption("no_report"),
                                self.worker_id)
        launches = report_dir / "runs" / self.run_id / "launches"  # an xdist worker's: its own
        self.launches_dir = launches / self.worker_id if self.worker_id else launches
        self.failures = FailureFormatter(root, sel.scenario_dir, sel.backend, self.device,
                                         self.launches_dir, dict(sel.paths))
        self.execution: Execution | None = None
        self.on_demand: OnDemand | None = None  # populations measured for this run's cases
        self.rank_server = None  # launch.rank_server.RankServer, where ranks fork (hooks.py)
        self.selected_items: dict[str, CaseItem] = {}  # case id -> item (this process)
        self.selected_cases: dict[str, Case] = {}  # xdist controller: case id -> case
        self.sigterm_handler = None

    # --- what items and interrupt.py ask for -----------------------------------------------
    @property
    def scheduler(self):
        return self.execution.scheduler if self.execution is not None else None

    def repro(self, item) -> str:
        return self.failures.repro(item)

    def failure_text(self, item, res: CaseResult) -> str:
        return self.failures.text(item, res)

    # --- collection -------------------------------------------------------------------------
    def pytest_report_header(self, config) -> list[str]:
        note = self.selection.backend_note
        lines = [f"harness: {note}"] if note else []
        if config.rootpath.resolve() == self.record.report_dir:  # "--report-dir DIR": a path
            lines.append(f"harness: pytest took the report dir for a path to test and roots the "
                         f"run there (its cache: the task seconds, on-demand populations); "
                         f"give it as --report-dir={self.record.report_dir}")
        return lines

    @pytest.hookimpl(trylast=True)  # after -k / -m deselection
    def pytest_collection_modifyitems(self, items) -> None:
        """Skip markers (world size, capability), strict xfails (registry), xdist groups."""
        keep, dropped = of_world_size(items, self.config.getoption("world_size"))
        if dropped:
            self.config.hook.pytest_deselected(items=dropped)
            items[:] = keep
        env, max_world = self.env.describe(), self.env.max_world()
        xdist = self.worker_id is not None
        for item in items:
            if not isinstance(item, CaseItem):
                continue
            reason = self.env.skip_reason(item.case, max_world)
            if reason:
                item.skip_reason = reason
                item.add_marker(pytest.mark.skip(reason=reason))
                continue
            self.xfails.apply(item, self.device, env)
            if xdist:
                item.add_marker(pytest.mark.xdist_group(scope_of(item.case)))

    def note_selected(self, nodeids) -> None:
        """xdist controller: the selected cases, from a worker's collected node ids."""
        by_id = self.selection.by_id()
        for nid in nodeids:
            case = by_id.get(str(nid).rsplit("::", 1)[-1])
            if case is not None:
                self.selected_cases[case.id] = case

    def pytest_collection_finish(self, session) -> None:
        items = [i for i in session.items if isinstance(i, CaseItem)]
        self.selected_items = {i.case.id: i for i in items}
        if not items:
            pytest.exit(self.selection.zero_cases(*(self.config.getoption(o) for o in (
                "world_size", "keyword", "markexpr"))), returncode=pytest.ExitCode.USAGE_ERROR)
        runnable = [(i.case, i.entries) for i in items if not i.skip_reason]
        if self.config.getoption("collectonly") or not runnable:
            return
        self.on_demand = OnDemand(self)  # calibration the cases need, run beside them
        self.execution = Execution.for_run(self)
        self.execution.start([c for c, _ in runnable] + self.on_demand.plan(runnable),
                             per_scope=self.worker_id is not None,
                             after=functools.partial(cancel_after_timeout, functools.partial(
                                 siblings, self.on_demand)))
        if self.worker_id is None and self.record.write_reports:
            results.import_writers()  # while the lanes start, not after the last one ended

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session) -> None:
        gc_pause.settle()  # paused by hooks.pytest_configure (also an xdist controller's)

    # --- outcomes and the end of the run ----------------------------------------------------
    def pytest_runtest_logreport(self, report) -> None:
        self.record.add_report(report)

    @pytest.hookimpl(tryfirst=True)  # before the terminal summary prints the paths
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        with interrupt.deferred():  # a second Ctrl-C must not cut the history write short
            try:
                if self.execution is not None:  # the lanes end (bounded) and record themselves
                    self.execution.shutdown(self.config, self.device)
                if self.worker_id is None:  # xdist workers: the controller writes the report
                    _finish(self, exitstatus)
                elif hasattr(self.config, "workeroutput"):
                    self.config.workeroutput["harness_launch_records"] = \
                        self.record.pop_launch_records()
            finally:
                if self.execution is not None:
                    self.execution.cleanup(self.config.getoption("keep_work"))
        if (self.record.report_error or self.record.unjudged()) \
                and session.exitstatus == pytest.ExitCode.OK:  # record lost, or not green
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.record.collected and self.worker_id is None:
            self.record.terminal_summary(terminalreporter, self.selection.backend_note)
        for line in summary(self.on_demand) if self.on_demand is not None else ():
            terminalreporter.write_line(line)


def _finish(hs, exitstatus) -> None:
    """The controller's end of a run: unfinished cases recorded as interrupted, the run's
    history and meta written, stale registry entries warned of."""
    rec = hs.record
    stopped = exitstatus == pytest.ExitCode.INTERRUPTED  # Ctrl-C / SIGTERM
    rec.launch_records += rec.pop_launch_records()  # launches that ended after the reports
    if stopped:
        for cid, outcome, info in interrupted.unfinished(hs, rec.collected):
            rec.collected[cid] = (outcome, info)
    if rec.collected and rec.write_reports:
        meta = results.run_meta(hs.root, hs.device, hs.backend, hs.env.describe())
        # fork / fresh: how the ranks started; the tasks with the last run's seconds
        meta.update(execution_meta(hs, rec.launch_records))
        meta["rank_env"] = hs.env.rank_env()
        rec.write(hs.run_id, meta, list(hs.selection.paths), hs.xfails.path)
    if stopped or not rec.collected:
        return
    hs.xfails.warn_stale(rec.collected, hs.backend, hs.selection.cases, hs.device)
