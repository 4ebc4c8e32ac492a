"""Known failures: ``scenarios/xfails.yaml``.

Each entry selects cases by scenario coordinates (axis values, lists or globs; plus
``scenario``, ``backend``, ``device``), optionally narrowed by installed versions and GPU
compute capability, and says why it fails and where that is tracked::

    entries:
      - match: {scenario: fix_verification, fixes: no_optimizer_dtensor_state}
        versions: {te: ">=2.0,<2.21"}        # PEP 440 specifiers, optional
        capability: ">=9.0,<10.0"            # CUDA compute capability, optional
        fails: {check: reshard, message: "Size mismatch"}   # optional: how it must fail
        reason: FusedAdam keeps optimizer states as plain tensors
        link: https://github.com/NVIDIA/TransformerEngine/pull/2795

Matching cases still run and are marked ``xfail(strict=True)``: an unexpected pass fails with
"remove xfail entry N". If ``fails`` is given, failing some other way is a real failure too.
A case matched by two entries is an error (entries must not overlap), and an entry that matches
no case of a scenario in the run is reported as stale. Capability gaps (a recipe the GPU
cannot run) are skips decided by the backend, never entries here.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .matrix import Case

CASE_KEYS = ("scenario", "backend", "device")
ENTRY_KEYS = {"match", "versions", "capability", "fails", "reason", "link", "device"}


class RegistryError(ValueError):
    pass


@dataclass
class Entry:
    number: int  # 1-based position in the file: "entry N"
    line: int
    match: dict[str, list[str]]
    reason: str
    link: str = ""
    versions: dict[str, SpecifierSet] = field(default_factory=dict)
    capability: SpecifierSet | None = None
    fails_check: str | None = None
    fails_message: str | None = None  # regex searched in the failure text

    @property
    def label(self) -> str:
        return f"xfail entry {self.number} (xfails.yaml line {self.line})"

    def xfail_reason(self) -> str:
        s = f"{self.label}: {self.reason}"
        if self.link:
            s += f" [{self.link}]"
        return s + f" -- if this passes, remove xfail entry {self.number}"

    def selects(self, coords: dict[str, str]) -> bool:
        for key, pats in self.match.items():
            if key not in coords or not any(fnmatch.fnmatchcase(coords[key], p) for p in pats):
                return False
        return True

    def applies(self, env: dict[str, str | None]) -> bool:
        """Versions / capability of this environment are within the entry's ranges."""
        for pkg, spec in self.versions.items():
            v = env.get(pkg)
            if v is None:
                return False
            try:
                if Version(v) not in spec:
                    return False
            except InvalidVersion:
                return False
        if self.capability is not None:
            cap = env.get("capability")
            if cap is None or Version(cap) not in self.capability:
                return False
        return True

    def explains(self, failure_text: str, failed_checks: set[str]) -> bool:
        if self.fails_check and self.fails_check not in failed_checks:
            return False
        if self.fails_message and not re.search(self.fails_message, failure_text):
            return False
        return True


def coords(case: Case, device: str) -> dict[str, str]:
    return {"scenario": case.scenario, "backend": case.backend, "device": device, **case.ax}


class Registry:
    def __init__(self, entries: list[Entry], path: Path | None = None):
        self.entries = entries
        self.path = path
        self.hits: dict[int, list[str]] = {e.number: [] for e in entries}

    def match(self, case: Case, device: str, env: dict) -> Entry | None:
        c = coords(case, device)
        found = [e for e in self.entries if e.selects(c) and e.applies(env)]
        if len(found) > 1:
            raise RegistryError(f"{self.path}: {case.id} matches "
                                f"{' and '.join(e.label for e in found)}; entries must not overlap")
        if found:
            self.hits[found[0].number].append(case.id)
            return found[0]
        return None

    def stale(self, scenarios: set[str], backend: str | None = None) -> list[Entry]:
        """Entries for the scenarios (and backend) this run ran cases of that matched none."""
        out = []
        for e in self.entries:
            pats = e.match.get("scenario", ["*"])
            backends = e.match.get("backend", ["*"])
            if backend is not None and not any(fnmatch.fnmatchcase(backend, b) for b in backends):
                continue
            if any(fnmatch.filter(scenarios, p) for p in pats) and not self.hits[e.number]:
                out.append(e)
        return out


def _spec(path, where, text) -> SpecifierSet:
    try:
        return SpecifierSet(str(text))
    except InvalidSpecifier:
        raise RegistryError(f"{path}: {where}: not a version range: {text!r} "
                            f"(PEP 440, e.g. '>=2.0,<2.21')") from None


def _entry_lines(text: str) -> list[int]:
    """1-based line of each entry, from the YAML node tree."""
    root = yaml.compose(text)
    if root is None or not hasattr(root, "value") or not isinstance(root.value, list):
        return []
    for key, value in root.value:
        if getattr(key, "value", None) == "entries" and isinstance(value.value, list):
            return [node.start_mark.line + 1 for node in value.value]
    return []


def load(path: str | Path, known_axes: set[str]) -> Registry:
    path = Path(path)
    if not path.is_file():
        return Registry([], path)
    text = path.read_text()
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise RegistryError(f"{path}: not valid YAML: {e}") from None
    items = raw.get("entries") or []
    if not isinstance(items, list):
        raise RegistryError(f"{path}: entries: must be a list")
    lines = _entry_lines(text)
    allowed = set(CASE_KEYS) | known_axes
    entries = []
    for n, item in enumerate(items, start=1):
        where = f"entries[{n - 1}] (entry {n})"
        if not isinstance(item, dict):
            raise RegistryError(f"{path}: {where}: must be a mapping")
        extra = set(item) - ENTRY_KEYS
        if extra:
            raise RegistryError(f"{path}: {where}: unknown field {sorted(extra)[0]!r}; allowed: "
                                f"{', '.join(sorted(ENTRY_KEYS))}")
        if not item.get("reason"):
            raise RegistryError(f"{path}: {where}: every entry needs a reason")
        match = item.get("match") or {}
        if not isinstance(match, dict) or not match:
            raise RegistryError(f"{path}: {where}.match: must select at least one coordinate")
        sel = {}
        for k, v in match.items():
            if k not in allowed:
                raise RegistryError(f"{path}: {where}.match.{k}: unknown coordinate; allowed: "
                                    f"{', '.join(sorted(allowed))}")
            sel[k] = [str(x) for x in (v if isinstance(v, list) else [v])]
        versions = {k: _spec(path, f"{where}.versions.{k}", v)
                    for k, v in (item.get("versions") or {}).items()}
        cap = item.get("capability")
        fails = item.get("fails") or {}
        if set(fails) - {"check", "message"}:
            raise RegistryError(f"{path}: {where}.fails: allowed keys are check, message")
        if fails.get("message"):
            try:
                re.compile(fails["message"])
            except re.error as e:
                raise RegistryError(f"{path}: {where}.fails.message: bad regex: {e}") from None
        entries.append(Entry(
            number=n, line=lines[n - 1] if n - 1 < len(lines) else 0, match=sel,
            reason=str(item["reason"]).strip(), link=str(item.get("link", "")),
            versions=versions,
            capability=_spec(path, f"{where}.capability", cap) if cap is not None else None,
            fails_check=fails.get("check"), fails_message=fails.get("message")))
    return Registry(entries, path)
