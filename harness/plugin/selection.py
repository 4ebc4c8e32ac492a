"""Which scenarios and cases a run selected: ``--scenario`` names -> scenario files -> specs
-> cases for the run's backend.

``--scenario all`` selects every file in the scenario dir, less the ones written for other
backends. With ``--backend`` left out the backend is the default, or the one backend the
selected scenarios' axes name (:func:`options.choose_backend`; its note goes in the header and
the summary).
"""

from __future__ import annotations

from pathlib import Path

from harness.plugin import options
from harness.spec.matrix import Case, expand
from harness.spec.scenario import ScenarioError, load_scenario, scenario_paths


def project_root(config) -> Path:
    """Where pytest was started if it has scenarios/, else pytest's rootdir (an existing path
    given as an option value can move pytest's rootdir elsewhere)."""
    here = Path(config.invocation_params.dir)
    return here if (here / "scenarios").is_dir() else Path(config.rootpath)


def resolve(names: list[str], scenario_dir: Path) -> dict[str, Path]:
    """Scenario name -> file for each ``--scenario`` value (a name in ``scenario_dir``, a
    ``.yaml`` path, or ``all``); ScenarioError for unknown or clashing names."""
    available = scenario_paths(scenario_dir)
    out: dict[str, Path] = {}
    for n in names:
        if n == "all":
            found = dict(available)
        elif n in available:
            found = {n: available[n]}
        elif Path(n).suffix == ".yaml" and Path(n).is_file():
            found = {Path(n).stem: Path(n).resolve()}
        else:
            raise ScenarioError(_unknown(n, scenario_dir, available))
        for name, path in found.items():  # one name, one file: ids and reports key on it
            if name in out and out[name].resolve() != path.resolve():
                raise ScenarioError(f"--scenario: two scenario files are named {name!r}: "
                                    f"{out[name]} and {path}; scenario names must be "
                                    f"unique (rename one file and its 'name:')")
            out[name] = path
    return out


def _unknown(n: str, scenario_dir: Path, available: dict) -> str:
    """One line for a ``--scenario`` value that names no scenario: a name, a file or a
    directory, each said as what it is."""
    names = ", ".join(available) or "none"
    p = Path(n)
    if p.is_dir():
        inside = ", ".join(scenario_paths(p)) or "none"
        return (f"--scenario {n}: a directory, not a scenario; name a scenario in it with "
                f"--scenario-dir {n} --scenario NAME (its scenarios: {inside}) or give a .yaml "
                f"file")
    if p.suffix in (".yaml", ".yml") or "/" in n or p.exists():
        what = "not a scenario file (a .yaml file)" if p.exists() else "no such file"
        return f"--scenario {n}: {what}; scenarios in {scenario_dir}: {names}"
    return f"--scenario {n}: no scenarios/{n}.yaml in {scenario_dir}; available: {names}"


class ScenarioSelection:
    """The selected scenarios: ``paths`` (name -> file), ``specs`` (name -> spec, every
    resolved file), ``cases`` (name -> cases, the scenarios this run runs), the ``backend``
    and ``backend_note``, and ``marks`` ((mark, file name) for each scenario mark)."""

    def __init__(self, scenario_dir: Path, names: list[str], backend: str | None,
                 case_timeout: float | None):
        self.scenario_dir = scenario_dir
        self.names = names
        self.paths = resolve(names, scenario_dir)
        self.specs = {n: load_scenario(p) for n, p in self.paths.items()}
        self.backend, self.backend_note = options.choose_backend(backend, self.specs, names)
        self.cases: dict[str, list[Case]] = {}
        self.marks: list[tuple[str, str]] = []
        for n, s in self.specs.items():
            if case_timeout:
                s.timeout_s = case_timeout
            if "all" in names and n not in names and not s.supports(self.backend):
                del self.paths[n]  # --scenario all: scenarios written for other backends
                continue
            self.cases[n] = expand(s, self.backend)
            self.marks += [(mark, s.path.name) for mark in s.marks]

    def known_axes(self) -> set[str]:
        """The axes of the selected scenarios and of every readable file in the scenario dir
        (what registry entries may match on)."""
        known = set().union(*(s.axes for s in self.specs.values()))
        all_specs = []
        for p in scenario_paths(self.scenario_dir).values():
            try:
                all_specs.append(load_scenario(p))
            except ScenarioError:
                continue  # a broken file elsewhere does not block this run; it fails its own
        return known | (set().union(*(s.axes for s in all_specs)) if all_specs else set())

    def zero_cases(self, world_size: int | None, keyword: str, markexpr: str) -> str:
        """Why the run selected no case, naming what dropped them: the backend (no case), the
        world size (no case of it) or -k / -m."""
        sel, b = " ".join(f"--scenario {n}" for n in self.names), self.backend
        sizes = sorted({max(c.world_sizes) for cs in self.cases.values() for c in cs})
        if not sizes:
            return f"{sel}: no case for backend {b}: nothing would be checked"
        if world_size and world_size not in sizes:
            return (f"--world-size {world_size}: no case of {sel} (backend {b}) has world size "
                    f"{world_size}; their world sizes: {', '.join(map(str, sizes))}")
        how = " and ".join(f"{flag} {v!r}" for flag, v in (("-k", keyword), ("-m", markexpr))
                           if v) or "selection"
        size = f" of world size {world_size}" if world_size else ""
        return f"{sel} selected zero cases{size} (backend {b}, after {how}): nothing would be " \
               f"checked"

    def by_id(self) -> dict[str, Case]:
        return {c.id: c for cs in self.cases.values() for c in cs}

    def covered_by(self, arg: str) -> bool:
        """Does command-line path ``arg`` (maybe ``file::node``) include a selected scenario?"""
        target = Path(str(arg).split("::")[0]).resolve()
        return any(p.resolve() == target or target in p.resolve().parents
                   for p in self.paths.values())

    def owns(self, path: Path) -> bool:
        return any(Path(path).resolve() == p.resolve() for p in self.paths.values())
