"""Expand a scenario's axes into cases: deterministic order, readable ids.

    fsdp2_tp_dcp[bf16-dp2xtp2-LayerNormMLP-async_thread-to_dp4]

Values appear in axis order (recipe, mesh, module, dcp, reshard, then extra axes in file
order). With ``cases``, only combinations matching one of its selections are kept (an axis a
selection does not name takes all its values); a case matching an ``exclude`` rule is dropped.
Both use glob values.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.spec import catalog
from harness.spec.mesh import MeshSpec, parse_mesh
from harness.spec.models import ModelRef
from harness.spec.scenario import ModelDims, ScenarioError, ScenarioSpec, TrainSpec


def reshard_target(value) -> MeshSpec | None:
    """The mesh a reshard axis value (``to_<mesh>``) loads onto; None for ``none`` (or a history
    row without the axis)."""
    if not isinstance(value, str) or not value.startswith(catalog.RESHARD_PREFIX):
        return None
    return parse_mesh(value[len(catalog.RESHARD_PREFIX):])


@dataclass(frozen=True)
class Case:
    scenario: str
    backend: str
    axes: tuple[tuple[str, str], ...]
    model: ModelDims
    train: TrainSpec
    checks: tuple[str, ...]  # the scenario's checks that apply to this case
    tolerances: dict = field(hash=False, compare=False, default_factory=dict)
    timeout_s: float = 180.0
    marks: tuple[str, ...] = ()
    # producer -> workaround name, from the case's xfail entries (set by the plugin)
    workarounds: tuple[tuple[str, str], ...] = field(default=(), hash=False, compare=False)
    # the factory the module axis value names (harness/spec/models.py); None for built-in modules
    model_ref: ModelRef | None = None

    @property
    def ax(self) -> dict[str, str]:
        return dict(self.axes)

    @property
    def recipe(self) -> str:
        return self.ax["recipe"]

    @property
    def mesh(self) -> MeshSpec:
        return parse_mesh(self.ax["mesh"])

    @property
    def target(self) -> MeshSpec | None:
        return reshard_target(self.ax["reshard"])

    @property
    def world_sizes(self) -> tuple[int, ...]:
        t = self.target
        return (self.mesh.world_size,) + ((t.world_size,) if t else ())

    @property
    def train_key(self) -> str:
        """What determines the case's train phase: every field but its reshard target, its
        pytest marks and what only the reshard phase runs (the ``reshard`` check, the reshard
        producers' workarounds). Cases with equal keys train, save and check the trained model
        the same way, so a run trains once for them (harness/launch/task_graph.py). The larger
        TP size of mesh and target stays in: a backend may set the train phase up for a TP
        target (the TE backend's #2713 port patches)."""
        d = self.to_json()
        d["axes"] = [[a, v] for a, v in self.axes if a != "reshard"]
        d["checks"] = [c for c in self.checks if c != "reshard"]
        d["workarounds"] = [list(w) for w in self.workarounds
                            if w[0] not in catalog.RESHARD_PRODUCERS]
        d["marks"] = []  # pytest's selection only
        d["tp"] = max(m.tp for m in (self.mesh, self.target) if m is not None)
        return json.dumps(d, sort_keys=True, default=str)

    @property
    def numerics(self) -> str:
        """The configuration a tolerance is derived for (a calibration population's
        ``config``): the model dims, the steps and learning rate, and for a model a scenario
        brings its factory -- what sets the size of a run's numerical error besides the
        population's backend, device, process groups, world size, module and recipe. The seed
        is left out: seeds are the samples a population is measured over."""
        return numerics_key(self.model, self.train, self.model_ref)

    @property
    def task(self) -> str:
        """What the module is trained on (catalog.TASKS): inputs, targets, loss."""
        if self.model_ref is not None:
            return self.model_ref.task
        return catalog.MODULE_TASKS[self.ax["module"]]

    @property
    def label(self) -> str:
        return "-".join(v for _, v in self.axes)

    @property
    def id(self) -> str:
        return f"{self.scenario}[{self.label}]"

    @property
    def key(self) -> str:
        """File-system safe and unique across scenarios and backends."""
        return f"{self.scenario}.{self.backend}.{self.label}"

    def to_json(self) -> dict[str, Any]:
        return dict(scenario=self.scenario, backend=self.backend, axes=[list(a) for a in self.axes],
                    model=asdict(self.model), train=asdict(self.train), checks=list(self.checks),
                    tolerances=self.tolerances, timeout_s=self.timeout_s, marks=list(self.marks),
                    workarounds=[list(w) for w in self.workarounds],
                    model_ref=self.model_ref.to_json() if self.model_ref else None)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Case":
        return cls(scenario=d["scenario"], backend=d["backend"],
                   axes=tuple(tuple(a) for a in d["axes"]), model=ModelDims(**d["model"]),
                   train=TrainSpec(**d["train"]), checks=tuple(d["checks"]),
                   tolerances=d["tolerances"], timeout_s=d["timeout_s"], marks=tuple(d["marks"]),
                   workarounds=tuple(tuple(w) for w in d.get("workarounds", ())),
                   model_ref=ModelRef.from_json(d.get("model_ref")))


def numerics_key(model: ModelDims, train: TrainSpec, model_ref: ModelRef | None = None) -> str:
    """``h32-f72-a4-s8-b8-o30-L2-v128-st3-lr0.01`` (+ ``-m<factory>``): see Case.numerics."""
    m = model
    key = (f"h{m.hidden}-f{m.ffn}-a{m.heads}-s{m.seq}-b{m.batch}-o{m.out_features}-L{m.layers}"
           f"-v{m.vocab}-st{train.steps}-lr{train.lr:g}")
    return key + (f"-m{model_ref.factory}" if model_ref is not None else "")


def numerics_of(spec: ScenarioSpec, backend: str, axes: dict[str, str]) -> str:
    """Case.numerics of the case at ``axes`` of ``spec`` (a history row's coordinates)."""
    coords = {**axes, "backend": backend}
    model = next((dims for sel, dims in spec.model_overrides if _matches(coords, [sel])),
                 spec.model)
    return numerics_key(model, spec.train, spec.models.get(axes.get("module")))


# the most combinations of axis values a scenario may have: collecting a case takes ~1 kB and
# a run checks a few hundred cases a minute, so a matrix past this is a mistake (an axis of
# thousands of values), refused before anything is built rather than growing until it is killed
MAX_CASES = 100_000


def check_size(spec: ScenarioSpec, backend: str, limit: int = MAX_CASES) -> None:
    """ScenarioError when the axes multiply to more than ``limit`` combinations: the size and
    the axes that multiply to it (computed from the axes' lengths, nothing expanded)."""
    sizes = {a: len(spec.axis_values(a, backend)) for a in spec.axes}
    total = math.prod(sizes.values())
    if total > limit:
        big = " x ".join(f"{a} {n:,}" for a, n in sizes.items())
        raise ScenarioError(f"{spec.path}: the axes multiply to {total:,} cases ({big}), more "
                            f"than the {limit:,} a run may hold; split the scenario or shorten "
                            f"its longest axes")


def _matches(axes: dict[str, str], rules: list[dict[str, list[str]]]) -> bool:
    """True when ``axes`` matches every key of at least one rule (values are globs)."""
    return any(all(any(fnmatch.fnmatchcase(axes[a], p) for p in pats) for a, pats in rule.items())
               for rule in rules)


def expand(spec: ScenarioSpec, backend: str = catalog.DEFAULT_BACKEND) -> list[Case]:
    """All cases of ``spec`` for ``backend``, in deterministic order.

    Raises ScenarioError when the axes multiply past MAX_CASES (before expanding), when a mesh
    cannot split the model dims, or when excludes leave nothing to run.
    """
    check_size(spec, backend)
    names = list(spec.axes)
    value_lists = [spec.axis_values(a, backend) for a in names]
    cases = []
    for combo in itertools.product(*value_lists):
        axes = dict(zip(names, combo))
        coords = {**axes, "backend": backend}  # rules may also select a backend
        if spec.cases is not None and not _matches(coords, spec.cases):
            continue
        if _matches(coords, spec.exclude):
            continue
        model = next((dims for sel, dims in spec.model_overrides if _matches(coords, [sel])),
                     spec.model)
        ref = spec.models.get(axes["module"])
        for axis in ("mesh", "reshard"):
            v = axes[axis]
            if v != catalog.RESHARD_NONE:
                target = v[len(catalog.RESHARD_PREFIX):] if axis == "reshard" else v
                model.check_mesh(parse_mesh(target), f"axes.{axis} '{v}'", spec.path,
                                 None if ref is not None else axes["module"])
                if ref is not None and ref.tp_plan is None and parse_mesh(target).tp > 1:
                    raise ScenarioError(f"{spec.path}: axes.{axis} '{v}': model "
                                        f"'{ref.name}' ({ref.origin}) has no tp_plan; a TP "
                                        f"mesh needs one")
        checks = tuple(c for c in spec.checks if catalog.check_applies(c, axes))
        train = spec.train  # axis 'seed' (calibration): the case's seed for init and data
        if "seed" in axes:
            train = dataclasses.replace(train, seed=int(axes["seed"]))
        marks = tuple(m for m, rules in spec.marks.items() if _matches(coords, rules))
        cases.append(Case(scenario=spec.name, backend=backend, axes=tuple(axes.items()),
                          model=model, train=train, checks=checks,
                          tolerances=spec.tolerances, timeout_s=spec.timeout_s, marks=marks,
                          model_ref=ref))
    if not cases:
        raise ScenarioError(f"{spec.path}: cases/exclude: the rules leave no case of the matrix "
                            f"for backend {backend}")
    return cases
