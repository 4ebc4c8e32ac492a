"""Scenario axes and case-selection rules (``axes``, ``cases``, ``exclude``, ``marks``
selections): every value checked against what the harness knows (``catalog``), every error
naming the file, the field and what is allowed. Used by ``spec.load_scenario``."""

from __future__ import annotations

import fnmatch
from typing import Any

from harness.spec import catalog
from harness.spec.base import _NAME, _VALUE, SEED_MAX, _fail
from harness.spec.mesh import MeshError, parse_mesh


def _check_value(path, axis: str, where: str, value, modules=catalog.MODULES) -> None:
    """Validate one axis value (not backend-specific). ``modules``: the module axis values
    this scenario may name (built-ins, its ``models``, installed entry points)."""
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
    elif axis == "module" and value not in modules:
        _fail(path, where, f"unknown module '{value}'; allowed: {', '.join(modules)} (or a "
                           f"name from the scenario's 'models', see README 'Bring your own "
                           f"model')")
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
    elif axis == "seed" and not (value.isdigit() and int(value) <= SEED_MAX):
        _fail(path, where, f"seed values are integers from 0 to {SEED_MAX}, got {value!r}")
    elif axis in catalog.EXTRA_AXES and catalog.EXTRA_AXES[axis][1] is not None and \
            value not in catalog.EXTRA_AXES[axis][1]:
        _fail(path, where, f"unknown {axis} value '{value}'; allowed: "
                           f"{', '.join(catalog.EXTRA_AXES[axis][1])}")


def _value_list(path, where, raw) -> list:
    if isinstance(raw, (str, int, float)):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        _fail(path, where, "must be a non-empty list of values")
    if len(set(map(str, raw))) != len(raw):
        _fail(path, where, f"duplicate values in {raw}")
    return raw


def _parse_axes(path, raw, modules=catalog.MODULES) -> dict[str, Any]:
    if not isinstance(raw, dict):
        _fail(path, "axes", "must be a mapping of axis name -> list of values")
    missing = [a for a in catalog.CORE_AXES if a not in raw]
    if missing:
        _fail(path, "axes", f"missing axes {missing}; every scenario has {list(catalog.CORE_AXES)}")
    axes: dict[str, Any] = {}
    for axis in list(catalog.CORE_AXES) + [a for a in raw if a not in catalog.CORE_AXES]:
        if not _NAME.match(str(axis)):
            _fail(path, f"axes.{axis}", "axis names are lower_snake_case")
        if axis not in catalog.CORE_AXES and axis not in catalog.EXTRA_AXES:
            _fail(path, f"axes.{axis}", f"unknown axis; the core axes are "
                                        f"{', '.join(catalog.CORE_AXES)} and the extra axes "
                                        f"{', '.join(catalog.EXTRA_AXES)}")
        values = raw[axis]
        if isinstance(values, dict):  # per backend: {torch: [...], te: [...], default: [...]}
            for backend, lst in values.items():
                if backend not in catalog.BACKENDS + ("default",):
                    _fail(path, f"axes.{axis}.{backend}", f"unknown backend; allowed: "
                                                          f"{', '.join(catalog.BACKENDS)}, default")
                lst = _value_list(path, f"axes.{axis}.{backend}", lst)
                for i, v in enumerate(lst):
                    _check_value(path, axis, f"axes.{axis}.{backend}[{i}]", v, modules)
                    if axis == "recipe" and backend != "default" and \
                            v not in catalog.RECIPES_BY_BACKEND[backend]:
                        _fail(path, f"axes.recipe.{backend}[{i}]",
                              f"recipe '{v}' is not available with backend {backend}; allowed: "
                              f"{', '.join(catalog.RECIPES_BY_BACKEND[backend])}")
            axes[axis] = {b: list(v) for b, v in values.items()}
            continue
        values = _value_list(path, f"axes.{axis}", values)
        if axis == "seed":  # integers in YAML; axis values are strings (ids, file names)
            values = [str(v) if isinstance(v, int) and not isinstance(v, bool) else v
                      for v in values]
        for i, v in enumerate(values):
            _check_value(path, axis, f"axes.{axis}[{i}]", v, modules)
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
    seen: dict[str, int] = {}  # a rule written out -> its first index
    for i, rule in enumerate(raw):
        where = f"{field_name}[{i}]"
        if not isinstance(rule, dict) or not rule:
            _fail(path, where, "each rule is a non-empty mapping {axis: value(s)}")
        key = repr(sorted((str(a), sorted(map(str, v)) if isinstance(v, list) else str(v))
                          for a, v in rule.items()))
        if key in seen:  # thousands of copies of one rule: silently slow, never meant
            _fail(path, where, f"repeats {field_name}[{seen[key]}]; each rule selects once, "
                               f"remove the copy")
        seen[key] = i
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
