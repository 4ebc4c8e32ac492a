"""A case's verdict from its result rows and the xfail entries that apply to it.

Exact semantics (the shape of pytest's own strict xfail, per failure instead of per test):

* every failing row (a check's ``fail``, a unit's ``error``; a timeout / crash is a ``case``
  failure) must be explained by a failure an entry names -- else the case FAILS, naming the
  entries that applied and each unexplained failure: one known bug never hides another;
* a failure an entry names may bound its size (``up_to`` / ``beyond`` on max_abs, rel_l2,
  n_diff): it explains a failing comparison -- the rows of one (phase, check, quantity,
  detail), one per metric -- only within those bounds, so a known failure cannot hide a
  larger one;
* every failure an entry names must happen where its unit ran: a named check that ran and
  passed is a strict XPASS ("remove it from entry N"), and so is a case that passed, and so is
  a ``beyond`` failure whose comparison failed smaller than it names; a failure marked
  ``strict: false`` (a value-dependent symptom) explains a row but need not happen;
* coverage: each unit of the case is passed / failed / xfailed (failed, every failure
  explained) / not_run (with the reason the worker gave).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.checks.outcomes import COVERAGE, FAILED

PASSED, FAILED_, XFAILED, XPASSED = "passed", "failed", "xfailed", "xpassed"


@dataclass
class Verdict:
    outcome: str  # passed | failed | xfailed | xpassed
    message: str = ""
    unexplained: list[dict] = field(default_factory=list)
    unmet: list[tuple] = field(default_factory=list)  # (entry, failure) that did not happen
    coverage: dict[str, tuple[str, str]] = field(default_factory=dict)  # unit -> (status, why)


def failing_rows(rows: list[dict], status: str, errors: list[str]) -> list[dict]:
    """The rows that failed, plus one ``case`` row for a timeout / crash / uncaught error."""
    out = [r for r in rows if r.get("outcome") in FAILED and r.get("metric") != COVERAGE]
    if status != "ok":
        text = "\n".join(errors)
        out.append(dict(check="case", quantity=status, metric="status", outcome="error",
                        detail=f"{status}: {text}"[:4000], phase=""))
    return out


def comparison_values(bad: list[dict]) -> list[dict]:
    """For each failing row, metric -> value over the rows of its comparison (same phase,
    check, quantity and detail: one Recorder.compare writes one row per metric)."""
    groups: dict[tuple, dict] = {}
    for r in bad:
        v = r.get("value")
        g = groups.setdefault((r.get("phase"), r["check"], r["quantity"], r.get("detail")), {})
        if isinstance(v, (int, float)):
            g[r.get("metric")] = v
    return [groups[(r.get("phase"), r["check"], r["quantity"], r.get("detail"))] for r in bad]


def judge(rows: list[dict], status: str = "ok", errors: list[str] = (), entries=()) -> Verdict:
    bad = failing_rows(rows, status, list(errors))
    sizes = comparison_values(bad)
    pairs = [(r, v) for r, v in zip(bad, sizes) if not any(e.explains(r, v) for e in entries)]
    unexplained = [r for r, _ in pairs]
    ran_ok = _units_that_passed(rows)
    unmet = [(e, f) for e in entries for f in e.fails
             if f.strict and not any(f.happened(r, v) for r, v in zip(bad, sizes))
             and (f.check in ran_ok or any(f.matches(r) for r in bad))]
    larger = _larger_than_registered(pairs, entries)
    coverage = _coverage(rows, bad, unexplained)
    if not bad:
        if entries:
            return Verdict(XPASSED, "; ".join(f"{e.label} expects {', '.join(map(str, e.fails))} "
                                              f"to fail, but the case passed: remove xfail entry "
                                              f"{e.number}" for e in entries),
                           coverage=coverage)
        return Verdict(PASSED, coverage=coverage)
    if unexplained or unmet or not entries:
        return Verdict(FAILED_, _message(entries, unexplained, unmet, larger), unexplained,
                       unmet, coverage)
    return Verdict(XFAILED, "; ".join(f"{e.label}: {e.reason}" for e in entries), [], [],
                   coverage)


def _units_that_passed(rows) -> set[str]:
    return {r["check"] for r in rows if r.get("metric") == COVERAGE and r["outcome"] == PASSED}


def _coverage(rows, bad, unexplained) -> dict[str, tuple[str, str]]:
    unexplained_units = {r["check"] for r in unexplained}
    bad_units = {r["check"] for r in bad}
    out = {}
    for r in rows:
        if r.get("metric") != COVERAGE:
            continue
        unit = r["check"]
        status = r["outcome"]
        if status in (FAILED_, PASSED) and unit in bad_units:
            status = FAILED_ if unit in unexplained_units else XFAILED
        out[unit] = (status, r.get("detail", ""))
    return out


def _larger_than_registered(pairs, entries) -> list[str]:
    """'check/quantity max_abs 0.0018 > 0.001 (entry N)' for each unexplained comparison that
    a bounded failure names but that exceeds the bound."""
    out = []
    for r, v in pairs:
        for e in entries:
            for f in e.fails:
                if f.matches(r):
                    out += [f"{r['check']}/{r['quantity']} {t} (entry {e.number})"
                            for t in f.too_large(r, v)]
    return list(dict.fromkeys(out))


def _message(entries, unexplained, unmet, larger=()) -> str:
    lines = []
    if larger:
        lines.append("larger than the known failure: " + "; ".join(larger))
    if entries:
        lines.append("xfail " + ", ".join(f"entry {e.number} explains "
                                          f"{', '.join(_short(f) for f in e.fails)}"
                                          for e in entries))
    if unexplained:
        lines.append(("not explained by any entry: " if entries else "failed: ") + "; ".join(
            f"{r['check']}/{r['quantity']}: {str(r.get('detail', ''))[:300]}"
            for r in _one_per_quantity(unexplained)))
    for e, f in unmet:
        if f.beyond:
            lines.append(f"{e.label} names {f} failing, but it did not fail that much: remove "
                         f"it from entry {e.number} or measure again")
        else:
            lines.append(f"{e.label} names {f} failing, but {f.check} ran and passed: remove "
                         f"it from entry {e.number}")
    return "\n".join(lines)


def _short(f) -> str:
    return f.check + (f"/{f.quantity}" if f.quantity else "")


def _one_per_quantity(rows) -> list[dict]:
    seen, out = set(), []
    for r in rows:
        k = (r.get("phase"), r["check"], r["quantity"])
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out
