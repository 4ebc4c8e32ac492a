"""Reading ``scenarios/xfails.yaml`` into :class:`registry.Registry`, as strictly as scenario
files are read: a key written twice (``match:`` or ``entries:``), an unknown key, a missing or
unreadable file -- each one line naming the file and the line, e.g.::

    scenarios/xfails.yaml: line 14: duplicate key 'match' (first at line 12); a mapping may
    name each key once
    scenarios/xfails.yaml: line 9: entries[1] (entry 2): unknown field 'why'; allowed: ...
    scenarios/xfails.yaml: line 30: entries[3] (entry 4).reason: 412 characters; a reason is
    one line of at most 160 naming the defect -- the measurements go to 'details'
    nope.yaml: no such file (an xfail registry is a YAML file with 'entries')

Strict because a lenient read hides mistakes: with ``yaml.safe_load`` the later of two
``match:`` keys wins without a word, and a registry path that does not exist would load as an
empty registry (every known failure then runs as a plain failure, and strict-xfail bookkeeping
is off unnoticed).
"""

from __future__ import annotations

import difflib
import fnmatch
from pathlib import Path

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from harness.spec import strict_yaml
from harness.spec.base import number_hint
from harness.verdict import regex_guard
from harness.verdict.registry import (
    CASE_KEYS,
    ENTRY_KEYS,
    EVIDENCE,
    FAILURE_KEYS,
    REASON_MAX,
    SIZE_METRICS,
    Entry,
    Failure,
    Registry,
    RegistryError,
)


def node_lines(node, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """(key, index, ...) path -> 1-based line of every mapping key and list item under
    ``node`` (a composed YAML node)."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            p = path + (getattr(k, "value", None),)
            out.setdefault(p, k.start_mark.line + 1)
            node_lines(v, p, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out.setdefault(path + (i,), v.start_mark.line + 1)
            node_lines(v, path + (i,), out)
    return out


class _File:
    """The registry file being read: its path and the line of each key, for the errors."""

    def __init__(self, path: Path, lines: dict[tuple, int]):
        self.path, self.lines = path, lines

    def error(self, keys: tuple, text: str) -> RegistryError:
        """``path: line N: text``, N the line of ``keys`` (or of the nearest enclosing key)."""
        for n in range(len(keys), 0, -1):
            if keys[:n] in self.lines:
                return RegistryError(f"{self.path}: line {self.lines[keys[:n]]}: {text}")
        return RegistryError(f"{self.path}: {text}")


def read(path: Path, missing_ok: bool) -> str | None:
    """The file's text; None for a missing file when ``missing_ok``; RegistryError for a
    missing, non-file or unreadable path."""
    if not path.exists():
        if missing_ok:
            return None
        raise RegistryError(f"{path}: no such file (an xfail registry is a YAML file with "
                            f"'entries', like scenarios/xfails.yaml)")
    if not path.is_file():
        raise RegistryError(f"{path}: not a file (an xfail registry is a YAML file with "
                            f"'entries')")
    try:
        return path.read_text()
    except OSError as e:
        raise RegistryError(f"{path}: cannot read the xfail registry ({e.strerror or e})") \
            from None
    except UnicodeDecodeError as e:
        raise RegistryError(f"{path}: not a text file ({e.reason} at byte {e.start})") from None


def load(path: str | Path, known_axes: set[str], missing_ok: bool = False) -> Registry:
    path = Path(path)
    text = read(path, missing_ok)
    if text is None:
        return Registry([], path)
    try:
        raw = strict_yaml.loads(text) or {}
        lines = node_lines(yaml.compose(text, Loader=strict_yaml.StrictLoader))
    except strict_yaml.DuplicateKeyError as e:
        raise RegistryError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise RegistryError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    f = _File(path, lines)
    if not isinstance(raw, dict):
        raise RegistryError(f"{path}: must be a mapping with one key, 'entries' (a list), got "
                            f"a {type(raw).__name__}")
    if set(raw) - {"entries"}:
        key = sorted(set(raw) - {"entries"}, key=str)[0]
        raise f.error((key,), f"unknown top-level key {key!r}; the file holds 'entries'")
    items = raw.get("entries") or []
    if not isinstance(items, list):
        raise f.error(("entries",), "entries: must be a list")
    allowed = set(CASE_KEYS) | known_axes
    return Registry([_entry(f, n, item, allowed) for n, item in enumerate(items, start=1)],
                    path)


def _entry(f: _File, n: int, item, allowed: set[str]) -> Entry:
    where, at = f"entries[{n - 1}] (entry {n})", ("entries", n - 1)
    if not isinstance(item, dict):
        raise f.error(at, f"{where}: must be a mapping")
    extra = set(item) - ENTRY_KEYS
    if extra:
        key = sorted(extra, key=str)[0]
        raise f.error(at + (key,), f"{where}: unknown field {key!r}; allowed: "
                                   f"{', '.join(sorted(ENTRY_KEYS))}")
    reason, details = _reason(f, at, where, item)
    match = item.get("match") or {}
    if not isinstance(match, dict) or not match:
        raise f.error(at + ("match",), f"{where}.match: must select at least one coordinate")
    sel = {}
    for k, v in match.items():
        if k not in allowed:
            raise f.error(at + ("match", k), f"{where}.match.{k}: unknown coordinate; "
                                             f"allowed: {', '.join(sorted(allowed))}")
        sel[k] = [str(x) for x in (v if isinstance(v, list) else [v])]
    versions = item.get("versions") or {}
    if not isinstance(versions, dict):
        raise f.error(at + ("versions",), f"{where}.versions: must map a package to a version "
                                          f"range, e.g. {{te: '>=2.0,<2.21'}}")
    versions = {k: _spec(f, at + ("versions", k), f"{where}.versions.{k}", v)
                for k, v in versions.items()}
    cap = item.get("capability")
    fails = _failures(f, at + ("fails",), f"{where}.fails", item.get("fails"))
    workaround = item.get("workaround")
    if workaround is not None:
        _check_workaround(f, at + ("workaround",), f"{where}.workaround", workaround, fails)
    return Entry(
        number=n, line=f.lines.get(at, 0), match=sel, reason=reason, details=details,
        fails=fails, link=str(item.get("link", "")), versions=versions,
        capability=(_spec(f, at + ("capability",), f"{where}.capability", cap)
                    if cap is not None else None),
        workaround=workaround, evidence=_evidence(f, at + ("evidence",), f"{where}.evidence",
                                                  item.get("evidence")), file=f.path.name)


def _evidence(f: _File, keys: tuple, where: str, raw) -> tuple[str, ...]:
    """``evidence``: one ``<commit>:<path>`` or a list of them (recorded runs in git history)."""
    items = [] if raw is None else raw if isinstance(raw, list) else [raw]
    for x in items:
        if not isinstance(x, str) or not EVIDENCE.fullmatch(x):
            raise f.error(keys, f"{where}: {x!r} is not <commit>:<path> (a recorded run in git "
                                f"history, e.g. a9e4b78:reports/gpu/<run>)")
    return tuple(items)


def _reason(f: _File, at: tuple, where: str, item: dict) -> tuple[str, str]:
    """(reason, details): the reason one line of at most REASON_MAX characters, since pytest
    prints it with every xfailed case; the measurements belong in ``details``."""
    reason = str(item.get("reason") or "").strip()
    if not reason:
        raise f.error(at, f"{where}: every entry needs a reason")
    if "\n" in reason or len(reason) > REASON_MAX:
        what = "several lines" if "\n" in reason else f"{len(reason)} characters"
        raise f.error(at + ("reason",), f"{where}.reason: {what}; a reason is one line of at "
                                        f"most {REASON_MAX} characters naming the defect -- "
                                        f"the measurements go to 'details'")
    details = item.get("details")
    if details is not None and not isinstance(details, str):
        raise f.error(at + ("details",), f"{where}.details: must be text, not "
                                         f"{type(details).__name__}")
    return reason, (details or "").strip()


def _spec(f: _File, keys: tuple, where: str, text) -> SpecifierSet:
    try:
        return SpecifierSet(str(text))
    except InvalidSpecifier:
        raise f.error(keys, f"{where}: not a version range: {text!r} (PEP 440, e.g. "
                            f"'>=2.0,<2.21')") from None


def _failures(f: _File, keys: tuple, where: str, raw) -> tuple[Failure, ...]:
    from harness.spec.catalog import UNITS
    if raw is None:
        raise f.error(keys[:-1], f"{where}: every entry names how its cases fail: "
                                 f"{{check: <one of {', '.join(UNITS)}>, message: <regex>}}")
    items = raw if isinstance(raw, list) else [raw]
    out = []
    for i, item in enumerate(items):
        w, k = (f"{where}[{i}]", keys + (i,)) if isinstance(raw, list) else (where, keys)
        if not isinstance(item, dict):
            raise f.error(k, f"{w}: must be a mapping {{check, quantity, message}}")
        extra = set(item) - FAILURE_KEYS
        if extra:
            key = sorted(extra, key=str)[0]
            raise f.error(k + (key,), f"{w}: unknown key {key!r}; allowed: "
                                      f"{', '.join(sorted(FAILURE_KEYS))}")
        check = item.get("check")
        if check not in UNITS:
            raise f.error(k + ("check",), f"{w}.check: unknown check {check!r}; allowed: "
                                          f"{', '.join(UNITS)}")
        msg = item.get("message")
        if msg is not None:
            why = regex_guard.problem(str(msg))
            if why:
                raise f.error(k + ("message",), f"{w}.message: {why}") from None
        q = item.get("quantity")
        if q is not None:
            _check_quantity(f, k + ("quantity",), f"{w}.quantity", check, str(q))
        strict = item.get("strict", True)
        if not isinstance(strict, bool):
            raise f.error(k + ("strict",), f"{w}.strict: must be true or false, not {strict!r}")
        out.append(Failure(check, None if q is None else str(q),
                           None if msg is None else str(msg), strict,
                           _sizes(f, k + ("up_to",), f"{w}.up_to", item.get("up_to")),
                           _sizes(f, k + ("beyond",), f"{w}.beyond", item.get("beyond"))))
    if len({(x.check, x.quantity) for x in out}) != len(out):
        raise f.error(keys, f"{where}: a check (and quantity) is named twice")
    if not any(x.strict for x in out):
        raise f.error(keys, f"{where}: every failure is strict: false; an entry must name at "
                            f"least one failure that must happen")
    return tuple(out)


def _check_quantity(f: _File, keys: tuple, where: str, check: str, q: str) -> None:
    """A check's quantity must be one it reports (catalog.CHECK_QUANTITIES): a misspelt one
    (``update_normz``) could never match, and would surface as an XPASS far from the typo."""
    from harness.spec.catalog import CHECK_QUANTITIES, EVERY_UNIT_QUANTITIES
    known = CHECK_QUANTITIES.get(check)
    if known is None or q in EVERY_UNIT_QUANTITIES or \
            any(fnmatch.fnmatchcase(q, p) for p in known):
        return
    near = difflib.get_close_matches(q, known, n=1)
    raise f.error(keys, f"{where}: {check} reports no quantity {q!r}"
                        + (f" (did you mean {near[0]!r}?)" if near else "")
                        + f"; its quantities: {', '.join(known + EVERY_UNIT_QUANTITIES)}")


def _sizes(f: _File, keys: tuple, where: str, raw) -> tuple[tuple[str, float], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        raise f.error(keys, f"{where}: must map a metric to a number, e.g. {{max_abs: 1.0e-3}};"
                            f" metrics: {', '.join(SIZE_METRICS)}")
    out = []
    for m, b in raw.items():
        if m not in SIZE_METRICS:
            raise f.error(keys + (m,), f"{where}.{m}: unknown metric; allowed: "
                                       f"{', '.join(SIZE_METRICS)}")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or b != b or b < 0:
            raise f.error(keys + (m,), f"{where}.{m}: must be a number >= 0, not {b!r}"
                                       f"{number_hint(b)}")
        out.append((m, float(b)))
    return tuple(out)


def _check_workaround(f: _File, keys: tuple, where: str, name, fails) -> None:
    from harness.worker.workarounds import WORKAROUNDS
    w = WORKAROUNDS.get(name)
    if w is None:
        raise f.error(keys, f"{where}: unknown workaround {name!r}; known: "
                            f"{', '.join(WORKAROUNDS)} (harness/worker/workarounds.py)")
    if not {x.check for x in fails} & set(w.units):
        raise f.error(keys, f"{where}: {name} stands in for {', '.join(w.units)}; the entry's "
                            f"fails must name one of them")
