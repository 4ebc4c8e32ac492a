"""pytest's hooks: ``pytest --scenario NAME`` turns a scenario's cases into pytest items.

Collection: each selected ``scenarios/NAME.yaml`` becomes a :class:`ScenarioFile` whose items
are the cases (so ``-k``, ``--collect-only``, ``-x``, ``--junitxml`` and xdist work). Skips
(world size, backend capability) and strict xfails (``scenarios/xfails.yaml``) are attached as
markers; pytest's own skipping plugin then gives XFAIL / XPASS(strict) outcomes.

This module holds the module-level hooks and the options; :class:`session.HarnessSession`
holds the run's parts and the hooks that need them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.launch import interrupt
from harness.plugin import execution, model_check, options
from harness.plugin.items import STASH, CaseItem, ScenarioFile
from harness.plugin.session import HarnessSession
from harness.spec import catalog
from harness.spec.scenario import ScenarioError
from harness.speed import bytecode_cache, gc_pause
from harness.verdict import registry
from harness.verdict.judge import XPASSED


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
                help="the results store this run writes to (default: $HARNESS_RESULTS, else "
                     "<rootdir>/reports)")
    g.addoption("--no-report", action="store_true",
                help="do not write history / summary to the results store")
    g.addoption("--case-timeout", type=float, default=None, metavar="S",
                help="override every scenario's per-case timeout_s")
    g.addoption("--model-check-timeout", type=float, default=None, metavar="S",
                help="how long collection waits for each scenario model's factory, TP plan "
                     "and first forward (default: %s s)" % model_check.PROBE_TIMEOUT_S)
    g.addoption("--keep-work", action="store_true",
                help="keep checkpoints (normally deleted at the end of the run)")
    g.addoption("--work-dir", default=None, metavar="DIR",
                help="where checkpoints go (default: a temporary dir; multi-node: shared storage)")
    g.addoption("--world-size", type=int, default=None, metavar="N",
                help="only cases whose largest world size is N (shard a nightly run by GPUs)")
    g.addoption("--launches-per-gpu", type=int, default=None, metavar="N",
                help="on cuda, run N launches at once on each GPU slice (the cases are small; "
                     "default 4, or one per module of a world size's cases where more); "
                     "1 = one launch per GPU slice")
    g.addoption("--max-ranks", type=int, default=None, metavar="N",
                help="on cuda, at most N rank processes of all launches at once on the host: "
                     "every pool's lanes scaled down to fit, one a pool at least (default "
                     "MAX_RANKS, launch/lanes.py; 0 = no bound)")
    g.addoption("--rank-start", choices=("auto", "fork", "fresh"), default="auto",
                help="fork: every launch's agent and ranks fork from one process of the run "
                     "that imported torch, the worker and the backend while pytest collected "
                     "(harness/launch/rank_server.py); fresh: a new Python per agent and rank "
                     "(torchrun's way); auto (default): fork with one node, unless a cuda run "
                     "sees no GPU")
    g.addoption("--accelerations", default="all", metavar="all|none|NAME,...",
                help="the layers that only make the run faster (harness/speed/layers.py): all "
                     "(default); none, the plain path (fresh torchrun agents and ranks, no "
                     "preload, no lane affinity; the same outcomes); or names, e.g. "
                     "all,-reference_cache or none,inductor_cache")
    g.addoption("--gpu-share", choices=("auto", "never", "always"), default="auto",
                help="where a case's world exceeds the GPUs its launch gets, ranks share them "
                     "(rank r on GPU r mod G) and every process group is gloo: auto (default) "
                     "shares only where needed, never skips such cases, always shares even "
                     "with a GPU per rank (harness/launch/placement.py)")
    g.addoption("--calibrate", choices=("auto", "off"), default="auto",
                help="a case whose calibrated quantities have no population at its "
                     "configuration (dims, steps, lr): auto (default) measures one from clean "
                     "seeded variants run beside it and caches it; off leaves them unjudged "
                     "(harness/calibration/on_demand.py)")
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
    if "bytecode_cache" in execution.chosen(config):  # before the backend imports torch
        bytecode_cache.apply()
    if "gc_pause" in execution.chosen(config):  # until the collection is done (session.py)
        gc_pause.pause()
    try:
        hs = HarnessSession(config, names)
    except (ScenarioError, registry.RegistryError, ValueError) as e:
        raise pytest.UsageError(str(e)) from None
    # from here pytest_unconfigure ends what the run started, however configure ends
    config.stash[STASH] = hs
    hs.sigterm_handler = interrupt.install()  # SIGTERM stops the run like Ctrl-C
    hs.rank_server = execution.rank_server_for(hs)  # its imports overlap what pytest does next
    try:
        _check_models(hs)
    except (ScenarioError, registry.RegistryError, ValueError) as e:
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
    gc_pause.settle()  # where the run ended before its collection did
    bytecode_cache.undo()
    hs = config.stash.get(STASH, None)
    if hs is not None:
        interrupt.uninstall(hs.sigterm_handler)
        if hs.rank_server is not None:
            hs.rank_server.stop()


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
        if report.failed and item.verdict is not None and item.verdict.outcome == XPASSED:
            # pytest says "[XPASS(strict)] <the marker's one-line reason>"; the verdict adds
            # which failures each entry expected and which entry to remove
            report.longrepr = f"{report.longrepr}\n{item.verdict.message}"
    return report


def _check_models(hs: HarnessSession) -> None:
    """The scenarios' own model factories (imports the backend)."""
    for n, cases in hs.selection.cases.items():
        model_check.check_scenario(hs.selection.specs[n], cases, hs.env.backend_obj, hs.backend,
                                   hs.device, hs.config.getoption("model_check_timeout")
                                   or model_check.PROBE_TIMEOUT_S)


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


