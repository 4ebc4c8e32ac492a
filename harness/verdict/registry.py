"""Known failures: ``scenarios/xfails.yaml``.

Each entry selects cases by scenario coordinates (axis values, lists or globs; plus
``scenario``, ``backend``, ``device``), optionally narrowed by installed versions and GPU
compute capability, names exactly how the cases fail, and says why and where that is tracked::

    entries:
      - match: {scenario: fix_verification, fixes: no_optimizer_dtensor_state}
        versions: {te: ">=2.0,<2.21"}        # PEP 440 specifiers, optional
        capability: ">=9.0,<10.0"            # CUDA compute capability, optional
        fails:                               # one failure, or a list of them
          - {check: optimizer_state_placement}
          - {check: reshard_load, message: "Size mismatch .*exp_avg"}   # regex on the detail
          - {check: dcp_roundtrip, quantity: state}
          - {check: reshard, quantity: next_loss, strict: false}   # may happen (say why)
          - {check: reshard, quantity: state, up_to: {n_diff: 100}}  # known size, measured
          - {check: reshard, quantity: next_params, beyond: {rel_l2: 0.06}}  # a bug on top
        workaround: load_without_extra_state  # optional, see harness/worker/workarounds.py
        reason: FusedAdam keeps optimizer states as plain tensors   # one line, <= 160 chars
        details: >                           # optional: the measurements, the evidence
          A same-mesh reload hands every rank rank 0's states; ...
        link: https://github.com/NVIDIA/TransformerEngine/pull/2795
        evidence: [<commit>:reports/gpu/<run>]   # optional: recorded runs, in git history

``reason`` names the defect in one line of at most ``REASON_MAX`` characters: pytest prints it
with every xfailed case (``-rx``), so it has to read as one line per case. What was measured,
on which cases, and why the sizes are what they are goes to ``details``, which the HTML report's
xfail ledger shows next to the reason.

``check`` is a check, a producer (``train``, ``save``, ``load``, ``reshard_load``, ...; see
``catalog.PRODUCERS``) or ``case`` (a timeout / crash); a check's ``quantity`` is one it reports
(``catalog.CHECK_QUANTITIES``); ``message`` is a regex that cannot backtrack for long
(``regex_guard``: checked at load, every search time-limited). Semantics are exact
(``harness/verdict/judge.py``): an entry explains only the failures it names; any other failure
of the case fails it, naming the entry and what is unexplained. Several entries may apply to one
case when they name different checks, different quantities of one check, or one check with
different messages (two that would explain the same failing row are an error). Strictness:
every strict failure must happen as named -- a named quantity (or message) of a check that ran
and did not fail that way, or a case that passed, is an XPASS failure ("remove it from entry N").
``strict: false`` explains a row when it happens and need not happen: for a symptom that
depends on the values (whether a re-quantization rounds back to the same scale differs between
CPUs); the reason says so, and every entry names at least one strict failure.
Sizes: ``up_to: {metric: X}`` (``max_abs``, ``rel_l2``, ``n_diff`` of a comparison) explains a
failing comparison only while each is <= X: a known failure cannot hide a larger one (the case
fails: "max_abs 1.8e-3 > 1e-3"), one that did not measure the metric (an error, a toleranced
comparison's n_diff) or structural failures (keys, shapes, NaN: ``n_problems``) its
``message`` does not name; set X from measurements with a margin, the reason says so.
``beyond: {metric: X}`` explains it only when each is > X, and a strict one must happen that
large: a second bug on top of a known failure of the same quantity. Two failures with disjoint
sizes do not overlap.
``evidence``: recorded runs the measurements come from, ``<commit>:<path>`` (``git show``
reaches each; tests/test_registry_evidence.py resolves every one).
``scenario: "@user"`` selects every scenario no entry names (a user's own): entries for the
library's defects list it, workarounds included. An entry applies only where a unit one of
its strict failures names runs (a case without DCP checks never loads). Entries that match no
case of a scenario in the run are reported as stale. A recipe the GPU cannot run is a skip."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.checks.outcomes import PROBLEMS
from harness.spec.matrix import Case
from harness.verdict import regex_guard

CASE_KEYS = ("scenario", "backend", "device")
USER = "@user"  # a scenario pattern: every scenario the registry names nowhere
CLEAN_VALUE = {"fixes": "all", "mutation": "none"}  # bug switches: axis -> value with no bug
ENTRY_KEYS = {"match", "versions", "capability", "fails", "workaround", "reason", "details",
              "link", "evidence"}
EVIDENCE = re.compile(r"[0-9a-f]{7,40}:[^\s:]+")  # <commit>:<path> (git show's form)
FAILURE_KEYS = {"check", "quantity", "message", "strict", "up_to", "beyond"}
SIZE_METRICS = ("max_abs", "rel_l2", "n_diff")
REASON_MAX = 160  # characters of an entry's reason, and of the xfail reason pytest prints


class RegistryError(ValueError):
    pass


@dataclass(frozen=True)
class Failure:
    """One failure an entry names: a unit (check / producer / case), optionally one quantity
    of it, a regex searched in the failing row's detail and the size it fails by: ``up_to``
    (explains a comparison only while each named metric is at most that: a known failure
    cannot hide a larger one) or ``beyond`` (only while each is larger: a bug on top of a
    known failure of the same quantity)."""
    check: str
    quantity: str | None = None
    message: str | None = None
    strict: bool = True  # must happen where its check runs (False: may happen)
    up_to: tuple[tuple[str, float], ...] = ()   # (metric, largest value explained)
    beyond: tuple[tuple[str, float], ...] = ()  # (metric, value it must exceed)

    def matches(self, row: dict) -> bool:
        """The row is of this check / quantity / message, whatever its size. The message
        search is time-limited (regex_guard): RegistryError when it runs past the limit."""
        return (row["check"] == self.check
                and (self.quantity is None or row["quantity"] == self.quantity)
                and (self.message is None or self._search(row.get("detail", ""))))

    def _search(self, detail: str) -> bool:
        try:
            return regex_guard.search(self.message, detail) is not None
        except regex_guard.RegexTimeout:
            raise RegistryError(
                f"xfail message regex /{self.message}/ ({self.check}) did not finish within "
                f"{regex_guard.MATCH_SECONDS:g} s on a detail of {len(detail)} characters; "
                f"simplify it (fewer unbounded repeats)") from None

    def happened(self, row: dict, values: dict[str, float] | None = None) -> bool:
        """Matches, is at least as large as ``beyond`` asks and measured every metric ``up_to``
        bounds (``values``: metric -> value of the row's comparison; default the row's own):
        a failure with no size cannot be within a size."""
        v = _values(row, values)
        return (self.matches(row) and all(m in v and v[m] > b for m, b in self.beyond)
                and all(m in v for m, _ in self.up_to))

    def explains(self, row: dict, values: dict[str, float] | None = None) -> bool:
        """Happened, and within every ``up_to`` bound (``too_large``)."""
        v = _values(row, values)
        return self.happened(row, v) and not self.too_large(row, v)

    def too_large(self, row: dict, values: dict[str, float] | None = None) -> list[str]:
        """'metric value > bound' for each ``up_to`` the row's comparison exceeds, and its
        structural failures (PROBLEMS: keys, shapes, NaN) unless a ``message`` names them."""
        v = _values(row, values)
        out = [f"{m} {v[m]:.4g} > {b:.4g}" for m, b in self.up_to if m in v and not v[m] <= b]
        if self.up_to and self.message is None and v.get(PROBLEMS, 0) > 0:
            out.append(f"{v[PROBLEMS]:g} structural failure(s), which no size bounds")
        return out

    def overlaps(self, other: "Failure") -> bool:
        """Would one failing row be explained by both? Same check, quantities not disjoint,
        not told apart by two different messages, and sizes not disjoint."""
        return (self.check == other.check
                and (self.quantity is None or other.quantity is None
                     or self.quantity == other.quantity)
                and (self.message is None or other.message is None
                     or self.message == other.message)
                and not _disjoint(self, other) and not _disjoint(other, self))

    def __str__(self) -> str:
        s = self.check + (f"/{self.quantity}" if self.quantity else "")
        s += f" /{self.message}/" if self.message else ""
        s += "".join(f" {m}<={b:g}" for m, b in self.up_to)
        s += "".join(f" {m}>{b:g}" for m, b in self.beyond)
        return s + ("" if self.strict else " (may)")


def _values(row: dict, values: dict | None) -> dict:
    if values is not None:
        return values
    v = row.get("value")
    return {row.get("metric"): v} if isinstance(v, (int, float)) else {}


def _disjoint(a: Failure, b: Failure) -> bool:
    """a's up_to ends where b's beyond starts, on some metric."""
    lo = dict(b.beyond)
    return any(m in lo and hi <= lo[m] for m, hi in a.up_to)


@dataclass
class Entry:
    number: int  # 1-based position in the file: "entry N"
    line: int
    match: dict[str, list[str]]
    reason: str
    fails: tuple[Failure, ...]
    link: str = ""
    versions: dict[str, SpecifierSet] = field(default_factory=dict)
    capability: SpecifierSet | None = None
    workaround: str | None = None
    evidence: tuple[str, ...] = ()  # <commit>:<path> of recorded runs
    details: str = ""  # the measurements behind the reason (shown by the HTML report)
    file: str = "xfails.yaml"  # the registry file's name, for the label

    @property
    def label(self) -> str:
        return f"xfail entry {self.number} ({self.file} line {self.line})"

    @property
    def failures_text(self) -> str:
        """The failures the entry names, with their sizes: 'reshard/state n_diff<=100, ...'."""
        return ", ".join(map(str, self.fails))

    @property
    def checks(self) -> set[str]:
        return {f.check for f in self.fails}

    def selects(self, coords: dict[str, str], user: bool = False) -> bool:
        """``user``: the case's scenario is one the registry names nowhere (``USER``)."""
        for key, pats in self.match.items():
            if key == "scenario" and user and USER in pats:
                continue
            if key not in coords or not any(fnmatch.fnmatchcase(coords[key], p) for p in pats):
                return False
        return True

    def runs_in(self, units) -> bool:
        """Some strict failure it names is of a unit in ``units`` (those a case runs)."""
        return any(f.strict and f.check in units for f in self.fails)

    def applies(self, env: dict[str, str | None]) -> bool:
        """Versions / capability of this environment are within the entry's ranges."""
        for pkg, spec in self.versions.items():
            try:
                if env.get(pkg) is None or Version(env[pkg]) not in spec:
                    return False
            except InvalidVersion:
                return False
        if self.capability is not None:
            cap = env.get("capability")
            if cap is None or Version(cap) not in self.capability:
                return False
        return True

    def explains(self, row: dict, values: dict[str, float] | None = None) -> bool:
        return any(f.explains(row, values) for f in self.fails)


def xfail_reason(entries: list[Entry]) -> str:
    """The reason of a case's strict xfail marker (pytest prints it): one line of at most
    REASON_MAX characters, the entry numbers, then their reasons cut at a word with '...'."""
    nums = ", ".join(str(e.number) for e in entries)
    text = (f"xfail entr{'y' if len(entries) == 1 else 'ies'} {nums}: "
            + " | ".join(" ".join(e.reason.split()) for e in entries))
    if len(text) <= REASON_MAX:
        return text
    return text[:REASON_MAX - 3].rsplit(" ", 1)[0] + "..."


def coords(case: Case, device: str) -> dict[str, str]:
    return {"scenario": case.scenario, "backend": case.backend, "device": device, **case.ax}


class Registry:
    def __init__(self, entries: list[Entry], path: Path | None = None):
        self.entries = entries
        self.path = path
        self.hits: dict[int, list[str]] = {e.number: [] for e in entries}
        self.named = {p for e in entries for p in e.match.get("scenario", ()) if p != USER}

    def user(self, scenario: str) -> bool:  # no entry names it: USER selects it
        return not any(fnmatch.fnmatchcase(scenario, p) for p in self.named)

    def match(self, case: Case, device: str, env: dict, units=None) -> list[Entry]:
        """The entries that apply to ``case`` here (``units``: those the case runs, where
        known); RegistryError when two name one check."""
        c, user = coords(case, device), self.user(case.scenario)
        found = [e for e in self.entries if e.selects(c, user) and e.applies(env)
                 and (units is None or e.runs_in(units))]
        for i, a in enumerate(found):
            for b in found[i + 1:]:
                both = sorted({str(f) for f in a.fails for g in b.fails if f.overlaps(g)})
                if both:
                    raise RegistryError(
                        f"{self.path}: {case.id} matches {a.label} and {b.label}, which both "
                        f"name {', '.join(both)}; entries that apply to one case must name "
                        f"different checks (or different quantities of one check)")
        for e in found:
            self.hits[e.number].append(case.id)
        return found

    def clean_twin_entries(self, case: Case, device: str, env: dict) -> list[Entry] | None:
        """For a case with a bug switched on (``fixes`` / ``mutation: no_<fix>``): the entries
        of its coordinates with the bug off -- what they leave unexplained caught the bug; None
        for other cases (no hits recorded)."""
        c = coords(case, device)
        for axis, off in CLEAN_VALUE.items():
            if c.get(axis, off) != off:
                clean = dict(c, **{axis: off})
                user = self.user(case.scenario)
                return [e for e in self.entries if e.selects(clean, user) and e.applies(env)]
        return None

    def stale(self, scenarios: set[str], backend: str | None = None,
              matrix: list[dict[str, str]] | None = None) -> list[Entry]:
        """Entries for the scenarios (and backend, device) this run ran cases of that matched
        none. ``matrix``: every case of those scenarios, selected or not; an entry that selects
        one is not stale (deselected by ``-k``, ``-m``, ``--world-size``, or skipped here)."""
        devices = {c["device"] for c in matrix or ()}
        out = []
        for e in self.entries:
            m = {k: e.match.get(k, ["*"]) for k in ("scenario", "backend", "device")}
            if (backend is not None and not any(fnmatch.filter([backend], p) for p in m["backend"])
                    or devices and not any(fnmatch.filter(devices, p) for p in m["device"])):
                continue  # another backend's or device's entry: not this run's to judge
            if any(fnmatch.filter(scenarios, p) for p in m["scenario"]) \
                    and not self.hits[e.number] and not any(e.selects(c) for c in matrix or ()):
                out.append(e)
        return out
