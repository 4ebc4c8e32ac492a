"""Scenario files: YAML in ``scenarios/`` loaded into a validated :class:`ScenarioSpec`.

Every error names the file, the field and what is allowed, e.g.::

    scenarios/x.yaml: axes.recipe[2]: unknown recipe 'fp9'; allowed: fp32, bf16, ...
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import catalog
from .mesh import MeshError, parse_mesh

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_VALUE = re.compile(r"^[A-Za-z0-9_.]+$")  # axis values appear in ids and file names
TOP_LEVEL = {"name", "description", "axes", "cases", "exclude", "model", "model_overrides",
             "train", "checks", "tolerances", "timeout_s", "marks"}


class ScenarioError(ValueError):
    """A scenario file that cannot be run as written."""


@dataclass(frozen=True)
class ModelDims:
    hidden: int = 32
    ffn: int = 72
    heads: int = 4
    seq: int = 8
    batch: int = 8  # global batch, split over the data-parallel ranks
    out_features: int = 30  # Linear / LayerNormLinear output: 30 rows shard unevenly over 4 ranks

    def check_mesh(self, mesh, where: str, path="") -> None:
        """Raise ScenarioError when a mesh cannot split these dims evenly where it must."""
        where = f"{path}: {where}" if path else where
        if self.batch % mesh.dp_size:
            raise ScenarioError(f"{where}: model.batch={self.batch} is not divisible by the "
                                f"{mesh.dp_size} data-parallel ranks of mesh {mesh.name}")
        if self.hidden % self.heads:
            raise ScenarioError(f"{where}: model.hidden={self.hidden} is not divisible by "
                                f"model.heads={self.heads}")
        for name in ("hidden", "ffn", "heads", "out_features"):
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


def _fail(path, where, msg):
    raise ScenarioError(f"{path}: {where}: {msg}")


def _check_value(path, axis: str, where: str, value) -> None:
    """Validate one axis value (not backend-specific)."""
    if not isinstance(value, str) or not _VALUE.match(value):
        _fail(path, where, f"axis values must be strings of letters, digits, '_' or '.', "
                           f"got {value!r}")
    if axis == "recipe" and value not in catalog.RECIPES:
        _fail(path, where, f"unknown recipe '{value}'; allowed: {', '.join(catalog.RECIPES)}")
    elif axis == "mesh":
        try:
            parse_mesh(value)
        except MeshError as e:
            _fail(path, where, str(e))
    elif axis == "module" and value not in catalog.MODULES:
        _fail(path, where, f"unknown module '{value}'; allowed: {', '.join(catalog.MODULES)}")
    elif axis == "dcp" and value not in catalog.DCP_MODES:
        _fail(path, where, f"unknown dcp mode '{value}'; allowed: {', '.join(catalog.DCP_MODES)}")
    elif axis == "reshard" and value != catalog.RESHARD_NONE:
        if not value.startswith(catalog.RESHARD_PREFIX):
            _fail(path, where, f"bad reshard '{value}'; allowed: 'none' or 'to_<mesh>' "
                               f"(e.g. to_dp2)")
        try:
            parse_mesh(value[len(catalog.RESHARD_PREFIX):])
        except MeshError as e:
            _fail(path, where, f"bad reshard target: {e}")
    elif axis == "fault" and value not in catalog.FAULTS:
        _fail(path, where, f"unknown fault '{value}'; allowed: {', '.join(catalog.FAULTS)}")


def _value_list(path, where, raw) -> list:
    if isinstance(raw, (str, int, float)):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        _fail(path, where, "must be a non-empty list of values")
    if len(set(map(str, raw))) != len(raw):
        _fail(path, where, f"duplicate values in {raw}")
    return raw


def _parse_axes(path, raw) -> dict[str, Any]:
    if not isinstance(raw, dict):
        _fail(path, "axes", "must be a mapping of axis name -> list of values")
    missing = [a for a in catalog.CORE_AXES if a not in raw]
    if missing:
        _fail(path, "axes", f"missing axes {missing}; every scenario has {list(catalog.CORE_AXES)}")
    axes: dict[str, Any] = {}
    for axis in list(catalog.CORE_AXES) + [a for a in raw if a not in catalog.CORE_AXES]:
        if not _NAME.match(str(axis)):
            _fail(path, f"axes.{axis}", "axis names are lower_snake_case")
        values = raw[axis]
        if isinstance(values, dict):  # per backend: {torch: [...], te: [...], default: [...]}
            for backend, lst in values.items():
                if backend not in catalog.BACKENDS + ("default",):
                    _fail(path, f"axes.{axis}.{backend}", f"unknown backend; allowed: "
                                                          f"{', '.join(catalog.BACKENDS)}, default")
                lst = _value_list(path, f"axes.{axis}.{backend}", lst)
                for i, v in enumerate(lst):
                    _check_value(path, axis, f"axes.{axis}.{backend}[{i}]", v)
                    if axis == "recipe" and backend != "default" and \
                            v not in catalog.RECIPES_BY_BACKEND[backend]:
                        _fail(path, f"axes.recipe.{backend}[{i}]",
                              f"recipe '{v}' is not available with backend {backend}; allowed: "
                              f"{', '.join(catalog.RECIPES_BY_BACKEND[backend])}")
            axes[axis] = {b: list(v) for b, v in values.items()}
            continue
        values = _value_list(path, f"axes.{axis}", values)
        for i, v in enumerate(values):
            _check_value(path, axis, f"axes.{axis}[{i}]", v)
        axes[axis] = list(values)
    return axes


def _all_values(axes, axis) -> set[str]:
    v = axes[axis]
    return set().union(*v.values()) if isinstance(v, dict) else set(v)


def _parse_rules(path, field_name, raw, axes) -> list[dict[str, list[str]]]:
    """``exclude`` / ``cases``: lists of {axis: value | [values] | glob} selections."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        _fail(path, field_name, "must be a list of {axis: value-or-list-or-glob} rules")
    rules = []
    for i, rule in enumerate(raw):
        where = f"{field_name}[{i}]"
        if not isinstance(rule, dict) or not rule:
            _fail(path, where, "each rule is a non-empty mapping {axis: value(s)}")
        parsed = {}
        for axis, pats in rule.items():
            if axis not in axes and axis != "backend":
                _fail(path, f"{where}.{axis}", f"unknown axis; axes are {', '.join(axes)} "
                                               f"(and 'backend')")
            pats = [str(p) for p in _value_list(path, f"{where}.{axis}", pats)]
            known = set(catalog.BACKENDS) if axis == "backend" else _all_values(axes, axis)
            for p in pats:
                if not fnmatch.filter(known, p):
                    _fail(path, f"{where}.{axis}", f"'{p}' matches none of the axis values "
                                                   f"{sorted(known)}")
            parsed[axis] = pats
        rules.append(parsed)
    return rules


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
        default = fields[k].default
        if isinstance(default, bool) or not isinstance(v, (int, float)) or isinstance(v, bool):
            _fail(path, f"{where}.{k}", f"must be a number, got {v!r}")
        if isinstance(default, int) and not isinstance(v, int):
            _fail(path, f"{where}.{k}", f"must be an integer, got {v!r}")
        if v <= 0 and k != "seed":
            _fail(path, f"{where}.{k}", f"must be > 0, got {v}")
        out[k] = v
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
                if not isinstance(tol.get(k), (int, float)) or tol[k] < 0:
                    _fail(path, f"{where}.{k}", f"must be a number >= 0, got {tol.get(k)!r}")
    return raw


def load_scenario(path: str | Path) -> ScenarioSpec:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: not valid YAML: {e}") from None
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
    axes = _parse_axes(path, raw.get("axes"))
    checks = raw.get("checks", list(catalog.DEFAULT_CHECKS))
    checks = _value_list(path, "checks", checks)
    for i, c in enumerate(checks):
        if c not in catalog.CHECKS:
            _fail(path, f"checks[{i}]", f"unknown check '{c}'; allowed: {', '.join(catalog.CHECKS)}")
    timeout = raw.get("timeout_s", 180)
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        _fail(path, "timeout_s", f"must be a number > 0 (seconds per case), got {timeout!r}")
    marks = _parse_marks(path, raw.get("marks"), axes)
    spec = ScenarioSpec(
        name=name, path=path, description=str(raw.get("description", "")).strip(),
        axes=axes, cases=_parse_rules(path, "cases", raw.get("cases"), axes) or None,
        exclude=_parse_rules(path, "exclude", raw.get("exclude"), axes),
        model=_parse_dataclass(path, "model", ModelDims, raw.get("model")),
        model_overrides=_parse_overrides(path, raw.get("model_overrides"), axes, raw.get("model")),
        train=_parse_dataclass(path, "train", TrainSpec, raw.get("train")),
        checks=tuple(checks), tolerances=_parse_tolerances(path, raw.get("tolerances")),
        timeout_s=float(timeout), marks=marks,
    )
    return spec


def scenario_paths(directory: Path) -> dict[str, Path]:
    """name -> path of every scenario file in ``directory`` (the xfail registry excluded)."""
    return {p.stem: p for p in sorted(Path(directory).glob("*.yaml")) if p.stem != "xfails"}
