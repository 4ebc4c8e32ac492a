"""pytest plugin: ``pytest --scenario NAME`` turns a scenario's cases into pytest items.

Collection: each selected ``scenarios/NAME.yaml`` becomes a :class:`ScenarioFile` whose items
are the cases (so ``-k``, ``--collect-only``, ``-x``, ``--junitxml`` and xdist work). Skips
(world size, backend capability) and strict xfails (``scenarios/xfails.yaml``) are attached as
markers; pytest's own skipping plugin then gives XFAIL / XPASS(strict) outcomes.

Running: the first item that needs a result makes the :class:`Scheduler` launch every ready
task of that world size at once (see scheduler.py); each item then reads its own result.
Rows travel on the test report (``report.harness``), so with xdist the controller gets them too;
at session end they are written to ``reports/`` and summarized in the terminal.

This module holds the hooks; :class:`HarnessSession` connects the parts, each in its module:
``selection`` (scenarios -> cases), ``environment`` (device, versions, GPUs), ``registry_match``
(xfail entries per case), ``execution`` (work dir, launcher, scheduler), ``failure_text``
(failure text, repro), ``run_record`` (outcomes, reports, terminal summary) and ``items`` (the
pytest nodes).
"""

from __future__ import annotations

from . import bytecode

# before anything imports torch: where torch ships no bytecode and the environment says not to
# write any, pytest would compile torch (and TE) on every run (harness/bytecode.py)
bytecode.use_here()

import contextlib
import shutil
import time
from pathlib import Path

import pytest

from . import catalog, early_launches, interrupt, options, registry, results
from .environment import RunEnvironment
from .execution import Execution, scope_of
from .failure_text import FailureFormatter, one_line
from .items import STASH, CaseFailed, CaseItem, ScenarioFile, XfailMismatch, coverage_rows
from .matrix import Case
from .registry_match import RegistryMatch
from .run_record import RunRecord, switched_cases
from .scheduler import CaseResult
from .selection import ScenarioSelection, of_world_size, project_root
from .spec import ScenarioError

# moved to their own modules; importable from here as before
__all__ = ["CaseFailed", "CaseItem", "HarnessSession", "STASH", "ScenarioFile",
           "XfailMismatch", "coverage_rows", "switched_cases"]
_one_line = one_line


# ---------------------------------------------------------------------------------------------
def pytest_addoption(parser):
    g = parser.getgroup("harness", "FSDP2 x TP x DCP scenario harness")
    g.addoption("--scenario", action="append", default=[], metavar="NAME",
                help="run scenario NAME (scenarios/NAME.yaml or a path); repeatable; 'all'")
    g.addoption("--scenario-dir", default=None, metavar="DIR",
                help="where scenario files live (default: ./scenarios, else <rootdir>/scenarios)")
    g.addoption("--backend", default=None, choices=catalog.BACKENDS,
                help="torch (plain PyTorch), reference (our TE-style quantized modules) or te "
                     "(TransformerEngine, GPU); default: torch, or the one backend the "
                     "selected scenarios' axes name")
    g.addoption("--device", default="auto", choices=("auto", "cpu", "cuda"),
                help="cpu (gloo) or cuda (NCCL); auto = cuda for --backend te, else cpu")
    g.addoption("--max-world-size", type=int, default=None, metavar="N",
                help="skip cases that need more ranks (default: all on cpu, #GPUs on cuda)")
    g.addoption("--xfail-registry", default=None, metavar="FILE",
                help="known-failure registry (default: <scenario-dir>/xfails.yaml)")
    g.addoption("--report-dir", default=None, metavar="DIR",
                help="where run reports go (default: <rootdir>/reports)")
    g.addoption("--no-report", action="store_true", help="do not write reports/")
    g.addoption("--case-timeout", type=float, default=None, metavar="S",
                help="override every scenario's per-case timeout_s")
    g.addoption("--keep-work", action="store_true",
                help="keep checkpoints (normally deleted at the end of the run)")
    g.addoption("--work-dir", default=None, metavar="DIR",
                help="where checkpoints go (default: a temporary dir; multi-node: shared storage)")
    g.addoption("--world-size", type=int, default=None, metavar="N",
                help="only cases whose largest world size is N (shard a nightly run by GPUs)")
    g.addoption("--launches-per-gpu", type=int, default=None, metavar="N",
                help="on cuda, run N launches at once on each GPU slice (the cases are small; "
                     "default 4, measured best on 2x H200: reports/bench); 1 = one launch "
                     "per GPU slice")
    g.addoption("--rank-start", choices=("auto", "fork", "fresh"), default="auto",
                help="how torchrun starts ranks: 'fork' from an agent that imported torch and "
                     "the harness once (harness/fork_agent.py), 'fresh' a new Python per rank; "
                     "auto (default): fork on CPU, fresh on cuda")
    g.addoption("--no-early-launches", action="store_true",
                help="start each launch when its lane has tasks, not while pytest collects "
                     "(harness/early_launches.py; default: early, without xdist or --nnodes)")
    g.addoption("--nnodes", type=int, default=1, metavar="N",
                help="split each launch over N torchrun agents (c10d rendezvous); without "
                     "--node-launcher they run on this host as simulated nodes")
    g.addoption("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                help="c10d rendezvous endpoint for --nnodes > 1 (default: 127.0.0.1:free port)")
    g.addoption("--node-launcher", default=None, metavar="CMD",
                help='command that starts one agent per node, e.g. "srun --nodes=2 '
                     '--ntasks-per-node=1" (see ci/slurm/)')


def pytest_configure(config):
    config.addinivalue_line("markers", "harness_case: a scenario case run under torchrun")
    names = config.getoption("scenario")
    if not names:
        return
    options.validate(config)  # one-line UsageErrors, before anything runs
    try:
        hs = HarnessSession(config, names)
    except (ScenarioError, registry.RegistryError, ValueError) as e:
        raise pytest.UsageError(str(e)) from None
    # from here pytest_unconfigure ends what the run started, however configure ends
    config.stash[STASH] = hs
    hs.sigterm_handler = interrupt.install()  # SIGTERM stops the run like Ctrl-C
    try:
        _start_early(hs)  # their start overlaps pytest's imports and collection
        _check_models(hs)
        _keep_early(hs)
    except (ScenarioError, registry.RegistryError, ValueError) as e:
        _close(hs, discard_run=True)  # a usage error leaves no run behind
        raise pytest.UsageError(str(e)) from None
    config.pluginmanager.register(hs, "harness-session")
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(p) for p in hs.selection.paths.values()]
    elif not any(hs.selection.covered_by(a) for a in config.args):
        # explicit paths that hold no selected scenario (or an option value pytest took for a
        # path): run the scenarios as well
        config.args = list(config.args) + [str(p) for p in hs.selection.paths.values()]
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(hs), "harness-xdist")
        if config.getoption("dist", "no") == "load":
            config.option.dist = "loadgroup"  # a scope's cases must share one worker


def pytest_unconfigure(config):
    hs = config.stash.get(STASH, None)
    if hs is not None:
        interrupt.uninstall(hs.sigterm_handler)
        _close(hs)  # early launches of a run that ended before its session did (bounded)


def pytest_collect_file(file_path: Path, parent):
    hs = parent.config.stash.get(STASH, None)
    if hs is not None and file_path.suffix == ".yaml" and hs.selection.owns(file_path):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if isinstance(item, CaseItem) and (call.when == "call" or (call.when == "setup" and report.skipped)):
        report.harness = item.info()  # plain data: survives xdist's report serialization
    return report


def _start_early(hs: "HarnessSession") -> None:
    """Start the launches the run's lanes will begin with (harness/early_launches.py), from
    the scenarios' cases that fit by world size (``-k`` / ``-m`` / skips are known only after
    collection: a launch no selected case needs is ended then)."""
    if early_launches.allowed(hs.config, hs.worker_id):
        cases = _fitting(hs)
        if cases:
            _execution(hs).start_early(cases)


def _keep_early(hs: "HarnessSession") -> None:
    """With the backend imported: end the early launches that only skipped cases would use."""
    if hs.execution is not None:
        max_world = hs.env.max_world()
        hs.execution.keep_early([c for c in _fitting(hs)
                                 if hs.env.skip_reason(c, max_world) is None])


def _fitting(hs: "HarnessSession") -> list:
    """The scenarios' cases that fit here by world size (``early_launches.fitting``)."""
    return early_launches.fitting(hs.selection.cases.values(), hs.config.getoption("world_size"),
                                  hs.env.max_world())


def _check_models(hs: "HarnessSession") -> None:
    """The scenarios' own model factories (imports the backend)."""
    from . import models
    for n, cases in hs.selection.cases.items():
        models.check_scenario(hs.selection.specs[n], cases, hs.env.backend_obj, hs.backend,
                              hs.device)


def _close(hs: "HarnessSession", discard_run: bool = False) -> None:
    """End the early launches of a run whose cases never got a scheduler (none selected,
    --collect-only, an error before collection ended); bounded, recorded, idempotent.
    ``discard_run``: the run never started (a usage error): its launch dirs go too."""
    if hs.execution is not None and hs.execution.scheduler is None:
        hs.execution.shutdown()
        hs.execution.cleanup(keep_work=False)
        hs.execution = None
        if discard_run:
            runs = hs.record.report_dir / "runs"
            shutil.rmtree(runs / hs.run_id, ignore_errors=True)
            with contextlib.suppress(OSError):
                runs.rmdir()  # only if no other run is there


def _execution(hs: "HarnessSession") -> Execution:
    """The run's Execution with its launcher (made once: early launches or collection's end)."""
    if hs.execution is None:
        hs.execution = Execution(hs.run_id, hs.config.getoption("work_dir"))
        launches = hs.record.report_dir / "runs" / hs.run_id / "launches"
        hs.execution.make_launcher(
            launches_dir=launches / hs.worker_id if hs.worker_id else launches,
            backend=hs.backend, device=hs.device, gpus=hs.env.visible_gpus(),
            on_launch=hs.record.on_launch,
            **{k: hs.config.getoption(k) for k in ("nnodes", "rdzv_endpoint", "node_launcher",
                                                   "launches_per_gpu", "rank_start")})
    return hs.execution


class _XdistHooks:
    """Registered only when pytest-xdist is installed (its hooks are unknown otherwise)."""

    def __init__(self, hs):
        self.hs = hs

    def pytest_configure_node(self, node):
        node.workerinput["harness_run_id"] = self.hs.run_id

    def pytest_testnodedown(self, node, error):
        """A worker's launches that ended after its last report (long-lived lanes end with the
        run) come back with the worker's output."""
        out = getattr(node, "workeroutput", None) or {}
        self.hs.record.launch_records += out.get("harness_launch_records", [])

    def pytest_xdist_node_collection_finished(self, node, ids):
        self.hs.note_selected(ids)  # the controller learns which cases the run selected


# ---------------------------------------------------------------------------------------------
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
                                  config.getoption("max_world_size"))
        self.backend, self.device = sel.backend, self.env.device
        reg_path = Path(config.getoption("xfail_registry") or sel.scenario_dir / "xfails.yaml")
        self.xfails = RegistryMatch(registry.load(reg_path, sel.known_axes() | {"fault"}))
        winput = getattr(config, "workerinput", None)
        self.worker_id = winput["workerid"] if winput else None
        self.run_id = (winput.get("harness_run_id") if winput else None) or results.new_run_id()
        rd = config.getoption("report_dir")
        # absolute: launches run with their own working directory
        report_dir = (here / Path(rd).expanduser() if rd else root / "reports").resolve()
        if not config.getoption("collectonly") and self.worker_id is None:
            options.check_writable("--report-dir", report_dir)  # launches log there too
            if config.getoption("work_dir"):
                options.check_writable("--work-dir", Path(config.getoption("work_dir")))
        self.record = RunRecord(t0, report_dir, not config.getoption("no_report"),
                                self.worker_id)
        self.failures = FailureFormatter(root, sel.scenario_dir, sel.backend, self.device,
                                         report_dir / "runs" / self.run_id / "launches")
        self.execution: Execution | None = None
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
        return [f"harness: {note}"] if note else []

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
            pytest.exit(f"--scenario {' '.join(self.selection.names)} selected zero cases "
                        f"(backend {self.backend}, after -k/-m selection): nothing would be "
                        f"checked", returncode=pytest.ExitCode.USAGE_ERROR)
        runnable = [i.case for i in items if not i.skip_reason]
        if self.config.getoption("collectonly") or not runnable:
            _close(self)  # early launches no case needs
            return
        _execution(self).start(runnable, per_scope=self.worker_id is not None,
                               device=self.device)
        if self.worker_id is None and self.record.write_reports:
            results.import_writers()  # while the lanes start, not after the last one ended

    # --- outcomes and the end of the run ----------------------------------------------------
    def pytest_runtest_logreport(self, report) -> None:
        self.record.add_report(report)

    @pytest.hookimpl(tryfirst=True)  # before the terminal summary prints the paths
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        with interrupt.deferred():  # a second Ctrl-C must not cut the history write short
            try:
                if self.execution is not None:  # the lanes end (bounded) and record themselves
                    self.execution.shutdown()
                if self.worker_id is None:  # xdist workers: the controller writes the report
                    self._finish(exitstatus)
                elif hasattr(self.config, "workeroutput"):
                    self.config.workeroutput["harness_launch_records"] = \
                        self.record.pop_launch_records()
            finally:
                if self.execution is not None:
                    self.execution.cleanup(self.config.getoption("keep_work"))
        if self.record.report_error and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # the run's record is lost

    def _finish(self, exitstatus) -> None:
        rec = self.record
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED  # Ctrl-C / SIGTERM
        rec.launch_records += rec.pop_launch_records()  # launches that ended after the reports
        if interrupted:
            for cid, outcome, info in interrupt.unfinished(self, rec.collected):
                rec.collected[cid] = (outcome, info)
        if rec.collected and rec.write_reports:
            meta = results.run_meta(self.root, self.device, self.backend, self.env.describe())
            rec.write(self.run_id, meta, list(self.selection.paths), self.xfails.path)
        if interrupted or not rec.collected:
            return
        self.xfails.warn_stale(rec.collected, self.backend)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.record.collected and self.worker_id is None:
            self.record.terminal_summary(terminalreporter, self.selection.backend_note)
