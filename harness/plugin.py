"""pytest plugin: ``pytest --scenario NAME`` turns a scenario's cases into pytest items.

Collection: each selected ``scenarios/NAME.yaml`` becomes a :class:`ScenarioFile` whose items
are the cases (so ``-k``, ``--collect-only``, ``-x``, ``--junitxml`` and xdist work). Skips
(world size, backend capability) and strict xfails (``scenarios/xfails.yaml``) are attached as
markers; pytest's own skipping plugin then gives XFAIL / XPASS(strict) outcomes.

Running: the first item that needs a result makes the :class:`Scheduler` launch every ready
task of that world size at once (see scheduler.py); each item then reads its own result.
Rows travel on the test report (``report.harness``), so with xdist the controller gets them too;
at session end they are written to ``reports/`` and summarized in the terminal.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest

from . import catalog, registry, results
from .launcher import Launcher
from .matrix import Case, expand
from .checks.record import FAILED
from .scheduler import CaseResult, Scheduler
from .spec import ScenarioError, load_scenario, scenario_paths

STASH = pytest.StashKey["HarnessSession"]()


class CaseFailed(AssertionError):
    """A case's checks failed or its tasks errored (the exception xfail entries expect)."""


class XfailMismatch(Exception):
    """An xfail-registered case failed, but not the way its entry says it should."""


# ---------------------------------------------------------------------------------------------
def pytest_addoption(parser):
    g = parser.getgroup("harness", "FSDP2 x TP x DCP scenario harness")
    g.addoption("--scenario", action="append", default=[], metavar="NAME",
                help="run scenario NAME (scenarios/NAME.yaml or a path); repeatable; 'all'")
    g.addoption("--scenario-dir", default=None, metavar="DIR",
                help="where scenario files live (default: ./scenarios, else <rootdir>/scenarios)")
    g.addoption("--backend", default=catalog.DEFAULT_BACKEND, choices=catalog.BACKENDS,
                help="torch (plain PyTorch), reference (our TE-style quantized modules) or te "
                     "(TransformerEngine, GPU)")
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
    try:
        hs = HarnessSession(config, names)
    except (ScenarioError, registry.RegistryError, ValueError) as e:
        raise pytest.UsageError(str(e)) from None
    config.stash[STASH] = hs
    config.pluginmanager.register(hs, "harness-session")
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(p) for p in hs.paths.values()]
    elif not any(hs.covered_by(a) for a in config.args):
        # explicit paths that hold no selected scenario (or an option value pytest took for a
        # path): run the scenarios as well
        config.args = list(config.args) + [str(p) for p in hs.paths.values()]
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(hs), "harness-xdist")
        if config.getoption("dist", "no") == "load":
            config.option.dist = "loadgroup"  # a scope's cases must share one worker


def pytest_collect_file(file_path: Path, parent):
    hs = parent.config.stash.get(STASH, None)
    if hs is not None and file_path.suffix == ".yaml" and hs.owns(file_path):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if isinstance(item, CaseItem) and (call.when == "call" or (call.when == "setup" and report.skipped)):
        report.harness = item.info()  # plain data: survives xdist's report serialization
    return report


class _XdistHooks:
    """Registered only when pytest-xdist is installed (its hooks are unknown otherwise)."""

    def __init__(self, hs):
        self.hs = hs

    def pytest_configure_node(self, node):
        node.workerinput["harness_run_id"] = self.hs.run_id


# ---------------------------------------------------------------------------------------------
class ScenarioFile(pytest.File):
    def collect(self):
        hs = self.config.stash[STASH]
        for case in hs.cases[self.path.stem]:
            yield CaseItem.from_parent(self, name=case.id, case=case)


class CaseItem(pytest.Item):
    def __init__(self, *, case: Case, **kw):
        super().__init__(**kw)
        self.case = case
        self.result: CaseResult | None = None
        self.entry: registry.Entry | None = None
        self.skip_reason = ""
        self.add_marker("harness_case")
        for m in case.marks:  # scenario 'marks' (e.g. ci: the representative slice)
            self.add_marker(m)

    @property
    def hs(self) -> "HarnessSession":
        return self.config.stash[STASH]

    def runtest(self):
        self.result = res = self.hs.scheduler.result(self.case)
        if res.passed:
            return
        text = self.hs.failure_text(self, res)
        if self.entry is not None and not self.entry.explains(
                text, {r["check"] for r in res.failed_rows} | ({"case"} if res.status != "ok" else set())):
            raise XfailMismatch(f"{self.entry.label} expects "
                                f"{self.entry.fails_check or 'any check'} to fail"
                                f"{' with /' + self.entry.fails_message + '/' if self.entry.fails_message else ''}"
                                f", but the case failed differently:\n{text}")
        raise CaseFailed(text)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, (CaseFailed, XfailMismatch)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, 0, self.name

    def info(self) -> dict:
        res, hs = self.result, self.hs
        out = dict(run_id=hs.run_id, case_id=self.case.id, case_key=self.case.key,
                   scenario=self.case.scenario, backend=self.case.backend, device=hs.device,
                   axes=[list(a) for a in self.case.axes], repro=hs.repro(self),
                   skip_reason=self.skip_reason, xfail_entry=self.entry.number if self.entry else None,
                   xfail_reason=self.entry.reason if self.entry else "")
        if res is not None:
            out.update(status=res.status, seconds=res.seconds, rows=res.rows,
                       launches=res.launches, summary=_one_line(res))
        out["launch_records"] = hs.pop_launch_records()
        return out


def fix_table(collected: dict) -> list[dict]:
    """One row per switched-off fix: the checks that failed without it, and the outcomes of the
    fix-off case and of the same coordinates with every fix on."""
    by_coords, rows = {}, []
    for cid, (outcome, info) in collected.items():
        ax = dict(info["axes"])
        if "fixes" in ax:
            key = (info["scenario"], tuple((k, v) for k, v in ax.items() if k != "fixes"))
            by_coords.setdefault(key, {})[ax["fixes"]] = (outcome, info)
    for key, variants in by_coords.items():
        on = variants.get("all", ("-", None))[0]
        for fixes, (outcome, info) in sorted(variants.items()):
            if not fixes.startswith("no_"):
                continue
            failed = sorted({r["check"] for r in info.get("rows", []) if r["outcome"] in FAILED})
            rows.append(dict(fix=fixes[3:], caught_by=", ".join(failed), off=outcome, on=on,
                             case=info["case_id"]))
    return sorted(rows, key=lambda r: r["fix"])


def _one_line(res: CaseResult) -> str:
    if res.status != "ok":
        return f"{res.status}: " + (res.errors[0].strip().splitlines()[-1] if res.errors else "")
    bad = sorted({f"{r['check']}/{r['quantity']}" for r in res.failed_rows})
    return ("failed: " + ", ".join(bad)) if bad else "all checks passed"


# ---------------------------------------------------------------------------------------------
class HarnessSession:
    """Everything the plugin holds for one pytest run (or one xdist worker)."""

    def __init__(self, config, names: list[str]):
        self.config = config
        self.t0 = time.time()
        # The project root: where pytest was started if it has scenarios/, else pytest's rootdir
        # (an existing path given as an option value can move pytest's rootdir elsewhere).
        here = Path(config.invocation_params.dir)
        root = here if (here / "scenarios").is_dir() else Path(config.rootpath)
        self.root = root
        self.scenario_dir = Path(config.getoption("scenario_dir") or root / "scenarios")
        self.names = names
        self.paths = self._resolve(names)
        self.backend = config.getoption("backend")
        dev = config.getoption("device")
        self.device = ("cuda" if self.backend == "te" else "cpu") if dev == "auto" else dev
        specs = {n: load_scenario(p) for n, p in self.paths.items()}
        timeout = config.getoption("case_timeout")
        self.cases: dict[str, list[Case]] = {}
        for n, s in specs.items():
            if timeout:
                s.timeout_s = timeout
            if "all" in names and n not in names and not s.supports(self.backend):
                del self.paths[n]  # --scenario all: scenarios written for other backends
                continue
            self.cases[n] = expand(s, self.backend)
            for mark in s.marks:
                config.addinivalue_line("markers", f"{mark}: scenario mark (see {s.path.name})")
        known_axes = set().union(*(s.axes for s in specs.values()))
        all_specs = []
        for p in scenario_paths(self.scenario_dir).values():
            try:
                all_specs.append(load_scenario(p))
            except ScenarioError:
                continue  # a broken file elsewhere does not block this run; it fails its own
        known_axes |= set().union(*(s.axes for s in all_specs)) if all_specs else set()
        reg_path = Path(config.getoption("xfail_registry") or self.scenario_dir / "xfails.yaml")
        self.registry = registry.load(reg_path, known_axes | {"fault"})
        winput = getattr(config, "workerinput", None)
        self.worker_id = winput["workerid"] if winput else None
        self.run_id = winput.get("harness_run_id") if winput else None
        self.run_id = self.run_id or results.new_run_id()
        rd = config.getoption("report_dir")
        self.report_dir = Path(rd) if rd else root / "reports"
        self.write_reports = not config.getoption("no_report")
        self.scheduler: Scheduler | None = None
        self.launcher: Launcher | None = None
        self.collected: dict[str, tuple[str, dict]] = {}  # case id -> (outcome, info)
        self.launch_records: list[dict] = []
        self._pending_records: list[dict] = []
        self.written: dict[str, Path] = {}
        self._backend_obj = None
        self.env = None

    # --- set-up ---------------------------------------------------------------------------
    def _resolve(self, names: list[str]) -> dict[str, Path]:
        available = scenario_paths(self.scenario_dir)
        out = {}
        for n in names:
            if n == "all":
                out.update(available)
            elif n in available:
                out[n] = available[n]
            elif Path(n).suffix == ".yaml" and Path(n).is_file():
                out[Path(n).stem] = Path(n).resolve()
            else:
                raise ScenarioError(f"--scenario {n}: no scenarios/{n}.yaml in "
                                    f"{self.scenario_dir}; available: {', '.join(available) or 'none'}")
        return out

    def covered_by(self, arg: str) -> bool:
        """Does command-line path ``arg`` (maybe ``file::node``) include a selected scenario?"""
        target = Path(str(arg).split("::")[0]).resolve()
        return any(p.resolve() == target or target in p.resolve().parents
                   for p in self.paths.values())

    def owns(self, path: Path) -> bool:
        return any(Path(path).resolve() == p.resolve() for p in self.paths.values())

    @property
    def backend_obj(self):
        if self._backend_obj is None:
            from . import backends
            self._backend_obj = backends.get(self.backend)
        return self._backend_obj

    def environment(self) -> dict:
        if self.env is None:
            import torch
            env = {"torch": torch.__version__.split("+")[0], "capability": None,
                   "device": self.device}
            if self.device == "cuda" and torch.cuda.is_available():
                major, minor = torch.cuda.get_device_capability(0)
                env["capability"] = f"{major}.{minor}"
            env.update(self.backend_obj.versions())
            self.env = env
        return self.env

    def visible_gpus(self) -> list[str]:
        """GPU ids launches may use: CUDA_VISIBLE_DEVICES if the caller set it, else all."""
        if self.device != "cuda":
            return []
        import torch
        if not torch.cuda.is_available():
            return []
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        if env:
            return [g.strip() for g in env.split(",") if g.strip()]
        return [str(i) for i in range(torch.cuda.device_count())]

    def max_world(self) -> int:
        m = self.config.getoption("max_world_size")
        if m:
            return m
        if self.device == "cuda":
            import torch
            return torch.cuda.device_count() if torch.cuda.is_available() else 0
        return 1 << 30

    @pytest.hookimpl(trylast=True)  # after -k / -m deselection
    def pytest_collection_modifyitems(self, items) -> None:
        """Skip markers (world size, capability), strict xfails (registry), xdist groups."""
        only = self.config.getoption("world_size")
        if only:
            keep, dropped = [], []
            for i in items:
                (keep if not isinstance(i, CaseItem) or max(i.case.world_sizes) == only
                 else dropped).append(i)
            if dropped:
                self.config.hook.pytest_deselected(items=dropped)
                items[:] = keep
        env, max_world = self.environment(), self.max_world()
        xdist = self.worker_id is not None
        for item in items:
            if not isinstance(item, CaseItem):
                continue
            need = max(item.case.world_sizes)
            reason = self.backend_obj.skip_reason(item.case, self.device)
            if reason is None and need > max_world:
                reason = (f"needs {need} ranks; --max-world-size / available "
                          f"{'GPUs' if self.device == 'cuda' else 'ranks'}: {max_world}")
            if reason:
                item.skip_reason = reason
                item.add_marker(pytest.mark.skip(reason=reason))
                continue
            try:
                entry = self.registry.match(item.case, self.device, env)
            except registry.RegistryError as e:
                raise pytest.UsageError(str(e)) from None
            if entry is not None:
                item.entry = entry
                item.add_marker(pytest.mark.xfail(reason=entry.xfail_reason(), strict=True,
                                                  raises=CaseFailed))
            if xdist:
                item.add_marker(pytest.mark.xdist_group(self.scope_of(item.case)))

    @staticmethod
    def scope_of(case: Case) -> str:
        return "w" + "to".join(map(str, case.world_sizes))

    def pytest_collection_finish(self, session) -> None:
        items = [i for i in session.items if isinstance(i, CaseItem)]
        if not items:
            pytest.exit(f"--scenario {' '.join(self.names)} selected zero cases (backend "
                        f"{self.backend}, after -k/-m selection): nothing would be checked",
                        returncode=pytest.ExitCode.USAGE_ERROR)
        runnable = [i.case for i in items if not i.skip_reason]
        if self.config.getoption("collectonly") or not runnable:
            return
        base = self.report_dir / "runs" / self.run_id / "launches"
        if self.worker_id:
            base = base / self.worker_id
        wd = self.config.getoption("work_dir")
        if wd:
            Path(wd).mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix=f"harness-{self.run_id}-", dir=wd))
        launcher = self.config.getoption("node_launcher")
        self.launcher = Launcher(base, self.backend, self.device, gpus=self.visible_gpus(),
                                 nnodes=self.config.getoption("nnodes"),
                                 rdzv_endpoint=self.config.getoption("rdzv_endpoint"),
                                 node_launcher=shlex.split(launcher) if launcher else None)
        xdist = self.worker_id is not None
        self.scheduler = Scheduler(self.launcher, runnable, self.work / "ckpt",
                                   scope_of=self.scope_of if xdist else (lambda c: "all"))
        self.scheduler.on_launch.append(self._on_launch)

    def _on_launch(self, rec) -> None:
        self._pending_records.append(dict(name=rec.name, worker=self.worker_id or "",
                                          world_size=rec.world_size, tasks=rec.tasks,
                                          wall_s=rec.wall_s, overhead_s=rec.overhead_s,
                                          returncode=rec.returncode, timed_out=rec.timed_out,
                                          gpus=rec.gpus))

    def pop_launch_records(self) -> list[dict]:
        out, self._pending_records = self._pending_records, []
        return out

    # --- reporting ------------------------------------------------------------------------
    def repro(self, item) -> str:
        args = ["pytest", "--scenario", item.case.scenario, "--backend", self.backend,
                "--device", self.device, "-p", "no:randomly", "-k", item.case.id]
        if self.scenario_dir.resolve() != (self.root / "scenarios").resolve():
            args[3:3] = ["--scenario-dir", str(self.scenario_dir)]
        return shlex.join(args)

    def failure_text(self, item, res: CaseResult) -> str:
        lines = [f"{item.case.id}: {_one_line(res)}"]
        for r in res.failed_rows:
            if r["metric"] in ("max_abs", "violations", "exception"):
                lines.append(f"  [{r['phase']}] {r['check']}/{r['quantity']}: {r['detail']}")
        for e in res.errors:
            lines.append(e.rstrip())
        if res.stacks:
            lines.append("Python stacks of the hung ranks:\n" + res.stacks.rstrip())
        if res.status != "ok":
            for who, text in res.logs.items():
                lines.append(f"--- log: {who} ---\n{text.rstrip()}")
        lines.append(f"launches: {', '.join(res.launches) or '-'} under "
                     f"{self.report_dir / 'runs' / self.run_id / 'launches'}")
        lines.append(f"repro: {self.repro(item)}")
        return "\n".join(lines)

    def pytest_runtest_logreport(self, report) -> None:
        info = getattr(report, "harness", None)
        if info is None:
            return
        if report.when == "call":
            if hasattr(report, "wasxfail"):
                outcome = "xfailed" if report.skipped else "xpassed"
            elif report.failed and "[XPASS(strict)]" in str(report.longrepr):
                outcome = "xpassed"
            else:
                outcome = report.outcome
        else:
            outcome = "skipped"
        self.collected[info["case_id"]] = (outcome, info)
        self.launch_records += info.get("launch_records", [])

    @pytest.hookimpl(tryfirst=True)  # before the terminal summary prints the paths
    def pytest_sessionfinish(self) -> None:
        if self.worker_id is not None:  # xdist workers: the controller writes the report
            self._cleanup()
            return
        if self.collected and self.write_reports:
            rows = [r for outcome, info in self.collected.values()
                    for r in results.case_rows(info, outcome)]
            meta = results.run_meta(self.root, self.device, self.backend, self.environment())
            wall = time.time() - self.t0
            overhead = sum(r["overhead_s"] for r in self.launch_records)
            launch_wall = sum(r["wall_s"] for r in self.launch_records)
            meta.update(run_id=self.run_id, scenarios=list(self.paths), wall_s=wall,
                        launches=self.launch_records, launch_overhead_s=overhead,
                        launch_wall_s=launch_wall, argv=sys.argv,
                        registry=str(self.registry.path))
            self.meta = meta
            self.written = results.write_run(self.report_dir, self.run_id,
                                             results.frame(rows, meta), meta)
        ran = {info["scenario"] for o, info in self.collected.values() if o != "skipped"}
        stale = self.registry.stale(ran, self.backend)
        for e in stale:
            if self.collected:
                warnings.warn(pytest.PytestWarning(
                    f"{e.label} matched no case of this run ({e.reason}); remove it if the "
                    f"failure is gone for good"))
        self._cleanup()

    def _cleanup(self) -> None:
        work = getattr(self, "work", None)
        if work is not None and not self.config.getoption("keep_work"):
            shutil.rmtree(work, ignore_errors=True)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        tr = terminalreporter
        if not self.collected or self.worker_id is not None:
            return
        tr.section("harness summary")
        counts = Counter(o for o, _ in self.collected.values())
        tr.write_line("outcomes: " + ", ".join(f"{counts.get(k, 0)} {k}" for k in results.OUTCOMES))
        ran = [(info.get("seconds", 0.0), cid) for cid, (o, info) in self.collected.items()
               if o not in ("skipped",)]
        for secs, cid in sorted(ran, reverse=True)[:5]:
            tr.write_line(f"  slow: {secs:6.1f}s  {cid}")
        wall = time.time() - self.t0
        recs = self.launch_records
        if recs:
            overhead = sum(r["overhead_s"] for r in recs)
            per_world = Counter(r["world_size"] for r in recs)
            tr.write_line(f"torchrun launches: {len(recs)} ("
                          + ", ".join(f"{n} x world {w}" for w, n in sorted(per_world.items()))
                          + f"); launch overhead {overhead:.1f}s = "
                            f"{100 * overhead / max(wall, 1e-9):.0f}% of {wall:.1f}s wall")
        xf = [(cid, info) for cid, (o, info) in self.collected.items() if o == "xfailed"]
        if xf:
            tr.write_line(f"expected failures (xfail registry): {len(xf)}")
        table = fix_table(self.collected)
        if table:
            tr.write_line("fix verification: fix -> check that caught it (fix off) -> outcomes")
            for row in table:
                tr.write_line(f"  {row['fix']:<24} caught by {row['caught_by'] or '-':<44} "
                              f"off: {row['off']:<8} on: {row['on']}")
        for k, p in self.written.items():
            tr.write_line(f"{k}: {p}")
