"""Scenario files: YAML in ``scenarios/`` loaded into a validated :class:`ScenarioSpec`.

Every error names the file, the field and what is allowed, e.g.::

    my_scenario.yaml: axes.recipe[2]: unknown recipe 'fp9'; allowed: fp32, bf16, ...

Nothing is silently resolved: a key written twice is an error (strict_yaml), an axis that is
neither a core axis nor a known extra one is an error (a typo would be a no-op axis), and every
number must be a finite number in its range -- YAML's ``yes`` / ``no`` are booleans, not 1 / 0,
and ``.nan`` / ``.inf`` are refused where they would crash or silently disable something.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.spec import catalog, models, strict_yaml
from harness.spec.axes import _all_values, _parse_axes, _parse_rules, _value_list
from harness.spec.base import (
    _NAME,
    _VALUE,
    FIELD_RANGES,
    MAX_TIMEOUT_S,
    TOP_LEVEL,
    ScenarioError,
    _check_number,
    _fail,
)
from harness.spec.models import ModelError, ModelRef

__all__ = ["ModelDims", "TrainSpec", "ScenarioSpec", "ScenarioError", "load_scenario",
           "scenario_paths", "FIELD_RANGES", "MAX_TIMEOUT_S", "TOP_LEVEL"]


@dataclass(frozen=True)
class ModelDims:
    hidden: int = 32
    ffn: int = 72
    heads: int = 4
    seq: int = 8
    batch: int = 8  # global batch, split over the data-parallel ranks
    out_features: int = 30  # Linear / LayerNormLinear output: 30 rows shard unevenly over 4 ranks
    layers: int = 2  # decoder layers of a stack (LlamaStack; factories may read it)
    vocab: int = 128  # token vocabulary (next_token models: embedding rows, LM head outputs)

    def check_mesh(self, mesh, where: str, path="", module: str | None = None) -> None:
        """Raise ScenarioError when a mesh cannot split these dims evenly where it must: the
        dims ``module`` builds with (``catalog.TP_DIMS``; every dim for a factory's model or
        where no module is given)."""
        where = f"{path}: {where}" if path else where
        used = catalog.TP_DIMS.get(module or "",
                                   ("hidden", "ffn", "heads", "out_features", "vocab"))
        if self.batch % mesh.dp_size:
            raise ScenarioError(f"{where}: model.batch={self.batch} is not divisible by the "
                                f"{mesh.dp_size} data-parallel ranks of mesh {mesh.name}")
        if "heads" in used and self.hidden % self.heads:
            raise ScenarioError(f"{where}: model.hidden={self.hidden} is not divisible by "
                                f"model.heads={self.heads}")
        for name in used:
            if getattr(self, name) % mesh.tp:
                raise ScenarioError(f"{where}: model.{name}={getattr(self, name)} is not "
                                    f"divisible by tp={mesh.tp} of mesh {mesh.name}")


@dataclass(frozen=True)
class TrainSpec:
    steps: int = 3
    lr: float = 1e-2
    seed: int = 1234


@dataclass
class ScenarioSpec:
    name: str
    path: Path
    description: str
    axes: dict[str, Any]  # axis -> list of values, or {backend: list}
    cases: list[dict[str, list[str]]] | None  # if set: only these selections of the axes
    exclude: list[dict[str, list[str]]]
    model: ModelDims
    model_overrides: list  # [(selection {axis: [globs]}, ModelDims)]: first match wins
    train: TrainSpec
    checks: tuple[str, ...]
    tolerances: dict[str, dict[str, dict[str, Any]]]  # check -> recipe -> {max_abs, rel_l2, reason}
    timeout_s: float
    marks: dict = field(default_factory=dict)  # pytest mark -> selections of cases it applies to
    # module axis values that name a factory: the scenario's ``models`` and installed entry
    # points (harness/spec/models.py), by name
    models: dict[str, ModelRef] = field(default_factory=dict)

    def supports(self, backend: str) -> bool:
        """Whether every axis has values ``backend`` can run."""
        try:
            for axis in self.axes:
                self.axis_values(axis, backend)
        except ScenarioError:
            return False
        return True

    def axis_values(self, axis: str, backend: str) -> list[str]:
        """Values of ``axis`` for ``backend``; ScenarioError if the scenario has none for it."""
        values = self.axes[axis]
        if isinstance(values, dict):
            if backend not in values and "default" not in values:
                raise ScenarioError(f"{self.path}: axes.{axis}: no values for backend "
                                    f"'{backend}' (has: {', '.join(values)})")
            values = values.get(backend, values.get("default"))
        if axis == "recipe":
            allowed = catalog.RECIPES_BY_BACKEND[backend]
            for i, v in enumerate(values):
                if v not in allowed:
                    raise ScenarioError(f"{self.path}: axes.recipe[{i}]: recipe '{v}' is not "
                                        f"available with --backend {backend}; allowed: "
                                        f"{', '.join(allowed)}")
        return list(values)


def _parse_dataclass(path, where, cls, raw):
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        _fail(path, where, "must be a mapping")
    fields = cls.__dataclass_fields__
    out = {}
    for k, v in raw.items():
        if k not in fields:
            _fail(path, f"{where}.{k}", f"unknown field; allowed: {', '.join(fields)}")
        lo, hi = FIELD_RANGES[k]
        out[k] = _check_number(path, f"{where}.{k}", v, lo, hi,
                               integer=isinstance(fields[k].default, int), above=(k == "lr"))
    return cls(**out)


def _parse_overrides(path, raw, axes, base) -> list:
    """``model_overrides: [{match: {axis: values}, model: {dims}}]`` -- e.g. block-aligned
    dims for quantized recipes. Unnamed dims keep the scenario's ``model`` values."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        _fail(path, "model_overrides", "must be a list of {match: {...}, model: {...}}")
    out = []
    for i, item in enumerate(raw):
        where = f"model_overrides[{i}]"
        if not isinstance(item, dict) or set(item) != {"match", "model"}:
            _fail(path, where, "each entry has exactly 'match' and 'model'")
        sel = _parse_rules(path, f"{where}.match", [item["match"]], axes)[0]
        dims = _parse_dataclass(path, f"{where}.model", ModelDims, {**(base or {}), **item["model"]})
        out.append((sel, dims))
    return out


def _parse_marks(path, raw, axes) -> dict:
    """``marks: {ci: [{selection}, ...]}``: cases matching a selection get ``pytest.mark.ci``
    (so ``-m ci`` runs a representative slice of a long matrix)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        _fail(path, "marks", "must be a mapping mark name -> list of case selections")
    out = {}
    for name, rules in raw.items():
        if not isinstance(name, str) or not _NAME.match(name):
            _fail(path, f"marks.{name}", "mark names are lower_snake_case")
        out[name] = _parse_rules(path, f"marks.{name}", rules, axes)
    return out


def _parse_tolerances(path, raw) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        _fail(path, "tolerances", "must be a mapping check -> recipe -> {max_abs, rel_l2, reason}")
    for check, by_recipe in raw.items():
        if check not in catalog.CHECKS:
            _fail(path, f"tolerances.{check}", f"unknown check; allowed: {', '.join(catalog.CHECKS)}")
        if not isinstance(by_recipe, dict):
            _fail(path, f"tolerances.{check}", "must be a mapping recipe -> tolerance")
        for recipe, tol in by_recipe.items():
            where = f"tolerances.{check}.{recipe}"
            if recipe not in catalog.RECIPES:
                _fail(path, where, f"unknown recipe; allowed: {', '.join(catalog.RECIPES)}")
            if not isinstance(tol, dict) or not tol.get("reason"):
                _fail(path, where, "needs max_abs, rel_l2 and a non-empty 'reason' (why this bound)")
            for k in tol:
                if k not in ("max_abs", "rel_l2", "reason"):
                    _fail(path, f"{where}.{k}", "unknown field; allowed: max_abs, rel_l2, reason")
            for k in ("max_abs", "rel_l2"):
                _check_number(path, f"{where}.{k}", tol.get(k), 0)
    return raw


_IMPORT_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$")
_MODEL_FIELDS = ("factory", "tp_plan", "task")


def _parse_models(path, raw) -> dict[str, ModelRef]:
    """``models: {name: {factory: "pkg.mod:build", tp_plan: "pkg.mod:plan", task: ...}}``:
    module axis values that name a factory (harness/spec/models.py says what it receives). The
    names appear in ids; a name shadows an installed entry point of the same name."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        _fail(path, "models", "must be a mapping name -> {factory, tp_plan, task}")
    out = {}
    for name, entry in raw.items():
        where = f"models.{name}"
        if not isinstance(name, str) or not _VALUE.match(name):
            _fail(path, where, "model names appear in ids: letters, digits, '_' or '.'")
        if name in catalog.MODULES:
            _fail(path, where, f"'{name}' is a built-in module; pick another name")
        if not isinstance(entry, dict):
            _fail(path, where, "must be a mapping with 'factory' (and optional 'tp_plan', "
                               "'task')")
        for k in entry:
            if k not in _MODEL_FIELDS:
                _fail(path, f"{where}.{k}", f"unknown field; allowed: {', '.join(_MODEL_FIELDS)}")
        for k in ("factory", "tp_plan"):
            v = entry.get(k)
            if (k == "factory" or v is not None) and not (isinstance(v, str)
                                                          and _IMPORT_PATH.match(v)):
                _fail(path, f"{where}.{k}", f"must be an import path 'package.module:name', "
                                            f"got {v!r}")
        task = entry.get("task", "regression")
        if task not in catalog.TASKS:
            _fail(path, f"{where}.task", f"unknown task {task!r}; allowed: "
                                         f"{', '.join(catalog.TASKS)}")
        out[name] = ModelRef(name, entry["factory"], entry.get("tp_plan"), task, origin=where)
    return out


def _used_models(path, axes, declared: dict[str, ModelRef]) -> dict[str, ModelRef]:
    """The model references the module axis names: the scenario's own, then entry points."""
    out = {}
    for name in sorted(_all_values(axes, "module") - set(catalog.MODULES)):
        if name in declared:
            out[name] = declared[name]
            continue
        try:
            out[name] = models.from_entry_point(name)
        except ModelError as e:
            _fail(path, "axes.module", str(e))
    return out


def load_scenario(path: str | Path) -> ScenarioSpec:
    path = Path(path)
    try:
        raw = strict_yaml.load(path)
    except strict_yaml.DuplicateKeyError as e:
        raise ScenarioError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: not valid YAML: {e}") from None
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{path}: not a text file ({e.reason} at byte {e.start}); a "
                            f"scenario is a UTF-8 YAML file") from None
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read ({e.strerror or e})") from None
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: a scenario file is a YAML mapping")
    unknown = set(raw) - TOP_LEVEL
    if unknown:
        _fail(path, sorted(unknown)[0], f"unknown field; allowed: {', '.join(sorted(TOP_LEVEL))}")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        _fail(path, "name", f"must be lower_snake_case, got {name!r}")
    if name != path.stem:
        _fail(path, "name", f"'{name}' must match the file name '{path.stem}'")
    declared = _parse_models(path, raw.get("models"))
    known = tuple(catalog.MODULES) + tuple(declared) + tuple(
        n for n in models.installed() if n not in declared)
    axes = _parse_axes(path, raw.get("axes"), known)
    checks = raw.get("checks", list(catalog.DEFAULT_CHECKS))
    checks = _value_list(path, "checks", checks)
    for i, c in enumerate(checks):
        if c not in catalog.CHECKS:
            _fail(path, f"checks[{i}]", f"unknown check '{c}'; allowed: {', '.join(catalog.CHECKS)}")
    timeout = _check_number(path, "timeout_s (seconds per case)", raw.get("timeout_s", 180), 0,
                            MAX_TIMEOUT_S, above=True)
    marks = _parse_marks(path, raw.get("marks"), axes)
    spec = ScenarioSpec(
        name=name, path=path, description=str(raw.get("description", "")).strip(),
        axes=axes, cases=_parse_rules(path, "cases", raw.get("cases"), axes) or None,
        exclude=_parse_rules(path, "exclude", raw.get("exclude"), axes),
        model=_parse_dataclass(path, "model", ModelDims, raw.get("model")),
        model_overrides=_parse_overrides(path, raw.get("model_overrides"), axes, raw.get("model")),
        train=_parse_dataclass(path, "train", TrainSpec, raw.get("train")),
        checks=tuple(checks), tolerances=_parse_tolerances(path, raw.get("tolerances")),
        timeout_s=float(timeout), marks=marks, models=_used_models(path, axes, declared),
    )
    return spec


def scenario_paths(directory: Path) -> dict[str, Path]:
    """name -> path of every scenario file in ``directory`` (the xfail registry excluded)."""
    return {p.stem: p for p in sorted(Path(directory).glob("*.yaml")) if p.stem != "xfails"}
