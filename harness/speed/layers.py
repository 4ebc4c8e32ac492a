"""The seam: which acceleration layers a run uses, decided once, asked everywhere.

Each :class:`Layer` is a way of getting the same outcomes sooner. The plain path -- every layer
off -- is the reference semantics: fresh torchrun agents and ranks (a new Python each), no
preload, lanes taking ready work in order, every FP32 reference and one-rank twin computed where
it is needed, every comparison by the general formula. A run chooses with
``pytest --accelerations`` (default ``all``; ``none`` is the plain path; ``all,-NAME`` or
``none,NAME`` switches one); the plugin folds in the older switches that turn a layer off too
(``Layer.also_off``, e.g. ``--rank-start fresh``). The choice travels to the launches and ranks
in their environment (:data:`VAR`), where :func:`active` reads it.

What each layer gained when it was added: docs/performance.md ("The accelerations").
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

VAR = "HARNESS_ACCELERATIONS"  # the launch environment's copy of the run's choice


@dataclass(frozen=True)
class Layer:
    name: str
    does: str  # what it does instead of the plain path
    code: str  # where it lives
    also_off: str = ""  # what else turns it off


LAYERS = (
    Layer("rank_server", "each launch's torchrun agent and ranks fork from one process of the "
          "run that imported torch, the worker and the backend while pytest collected (its "
          "objects frozen); plain: a fresh Python per agent and rank",
          "launch/rank_server.py, launch/fork_agent.py, launch/server_preload.py",
          "--rank-start fresh; --rank-start auto where a cuda run sees no GPU; more than one "
          "node"),
    Layer("stager_fork", "a rank's DCP async_process stager forks from the rank server; plain: "
          "DCP spawns it", "worker/stager_fork.py", "no rank server"),
    Layer("stager_no_gpu", "a forked stager sees no GPU (CUDA_VISIBLE_DEVICES empty): DCP's "
          "file writer then reads the staged CPU copies without a CUDA stream; plain: each "
          "stager's first save makes a CUDA context of its own to ask for its current stream",
          "worker/stager_fork.py (_become)", "no rank server; CPU runs"),
    Layer("stager_prestart", "GPU launches that may run an async_process save start DCP's stager "
          "with the ranks; plain: at the first such save", "launch/launcher.py (expect)",
          "CPU runs"),
    Layer("gc_pause", "pytest's garbage collector paused while torch, the backend and the cases "
          "load, then what is alive frozen", "speed/gc_pause.py"),
    Layer("inductor_cache", "the ranks' TorchInductor caches outlive their launch, one compile "
          "thread; plain: Inductor's defaults in the launch's own temporary directory",
          "speed/inductor_cache.py"),
    Layer("bytecode_cache", "where Python may not write bytecode and torch has none beside "
          "its sources, pytest and every process it starts keep bytecode in a cache of the "
          "harness's own (sys.pycache_prefix, PYTHONPYCACHEPREFIX); plain: Python's way, each "
          "process compiling from source what it imports",
          "speed/bytecode_cache.py (launch_env: launch/launch.py run_env), plugin/hooks.py "
          "(configure), launch/fork_agent.py (the rank server's preload)",
          "does nothing (the run's meta: bytecode) where the user set a cache prefix, Python "
          "may write bytecode, torch has its bytecode or the cache cannot be made"),
    Layer("task_seconds", "the scheduler weighs tasks by the seconds they took in the last run "
          "(pytest's cache); plain: every task weighs the same", "speed/task_seconds.py",
          "-p no:cacheprovider"),
    Layer("lane_affinity", "a lane keeps to the (module, recipe) pairs it ran, async_process "
          "saves last (a mode group's come with it), takes over the module with most work "
          "left; plain: the first ready batch",
          "speed/lane_choice.py (affinity)"),
    Layer("lane_per_module", "on GPU, a lane per module of a world size's cases where more than "
          "the default launches per GPU, more for a costly module; plain: --launches-per-gpu",
          "launch/placement.py (launches_per_slice), speed/lane_choice.py (extra_lanes)",
          "an explicit --launches-per-gpu; CPU runs"),
    Layer("lanes_per_gpu", "on GPU, a slice of g GPUs takes g times the launches one GPU takes "
          "of a world size (ranks per GPU and per core as on one GPU); plain: one GPU's count "
          "whatever the slice's GPUs", "launch/placement.py (launches_per_slice)", "CPU runs"),
    Layer("pool_lanes", "on GPU, a world size whose tasks run on NCCL and gloo splits its lanes "
          "between the two by their tasks; plain: each takes the world's count",
          "launch/placement.py (pool_shares)", "CPU runs"),
    Layer("cpu_priority", "on GPU, ranks of smaller worlds run at a lower CPU priority; plain: "
          "the host's default", "launch/placement.py (cpu_priority)", "CPU runs"),
    Layer("reference_cache", "the FP32 reference and one-rank twin computed once per run for "
          "everything that determines them; plain: computed for every task that needs them",
          "speed/reference_cache.py"),
    Layer("mode_group", "the cases of a world that differ only in their DCP mode train once: "
          "each further mode saves from the first's trained run put back in place, kept where "
          "the state its save captured and its next step equal the first's bit for bit, else "
          "it trains its own; plain: every mode trains its own run",
          "launch/task_graph.py (mode_free_key), worker/mode_group.py, "
          "distributed/restore_point.py", "a case injecting a fault"),
    Layer("context_order", "the ranks of the launches that start together make their CUDA "
          "contexts the largest world first, each tier after the one before (bounded wait); "
          "plain: every rank at once", "launch/context_order.py, worker/context_gate.py",
          "CPU runs; a host of one GPU (slower there); more than one node"),
    Layer("compare_fast_path", "comparisons of equal or all-finite tensors on the CPU without "
          "the general formula's masks; plain: the general formula", "checks/compare.py "
          "(_equal_stats, _finite_stats)"),
)
NAMES = tuple(layer.name for layer in LAYERS)


@dataclass(frozen=True)
class Accelerations:
    """The layers a run uses: ``name in acc`` (an unknown name is an error, not off)."""
    on: frozenset

    def __contains__(self, name: str) -> bool:
        if name not in NAMES:
            raise KeyError(f"no acceleration layer {name!r} (layers: {', '.join(NAMES)})")
        return name in self.on

    def without(self, *names: str) -> "Accelerations":
        return Accelerations(self.on - set(names))

    def env(self) -> dict:
        """What a launch's environment carries for :func:`active` in its ranks."""
        return {VAR: ",".join(n for n in NAMES if n in self.on) or "none"}

    def describe(self) -> str:
        """``all``, ``none``, ``all but a, b`` or the names on (for the run's meta)."""
        off = [n for n in NAMES if n not in self.on]
        if not off or not self.on:
            return "none" if off else "all"
        if len(off) <= len(self.on):
            return "all but " + ", ".join(off)
        return ", ".join(n for n in NAMES if n in self.on)


ALL = Accelerations(frozenset(NAMES))
PLAIN = Accelerations(frozenset())


def parse(value: str) -> Accelerations:
    """``all``, ``none`` or comma-separated names; ``-NAME`` turns one off (``all,-x``),
    ``NAME`` on (``none,x``). ValueError naming the bad part."""
    parts = [p.strip() for p in (value or "").split(",") if p.strip()]
    if not parts:
        raise ValueError("expected all, none or layer names")
    on = set(NAMES) if parts[0] == "all" else set()
    for p in parts[1:] if parts[0] in ("all", "none") else parts:
        name = p[1:] if p.startswith("-") else p
        if name not in NAMES:
            raise ValueError(f"no layer {name!r}; the layers: {', '.join(NAMES)}")
        (on.discard if p.startswith("-") else on.add)(name)
    return Accelerations(frozenset(on))


def from_described(text: str) -> Accelerations:
    """The layers a run's meta names (:meth:`Accelerations.describe`'s words); unknown names
    (a layer since removed) are left out."""
    text = text.strip()
    if text in ("all", "none"):
        return ALL if text == "all" else PLAIN
    named = {n.strip() for n in text.removeprefix("all but ").split(",")} & set(NAMES)
    return Accelerations(frozenset(set(NAMES) - named if text.startswith("all but ") else named))


def from_env(env=None) -> Accelerations:
    """The choice a launch's environment carries; every layer where it carries none (a worker
    started by hand, a test calling a module directly: the default)."""
    value = (os.environ if env is None else env).get(VAR)
    return _parsed(value) if value else ALL


@functools.lru_cache(maxsize=8)
def _parsed(value: str) -> Accelerations:
    return parse(value)


def active(name: str) -> bool:
    """Whether layer ``name`` is on in this process (a rank: its launch's environment)."""
    return name in from_env()
