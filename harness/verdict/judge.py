"""A case's verdict from its result rows and the xfail entries that apply to it.

Exact semantics (the shape of pytest's own strict xfail, per failure instead of per test):

* every failing row (a check's ``fail``, a unit's ``error``; a timeout / crash is a ``case``
  failure) must be explained by a failure an entry names -- else the case FAILS, naming the
  entries that applied and each unexplained failure: one known bug never hides another;
* a failure an entry names may bound its size (``up_to`` / ``beyond`` on max_abs, rel_l2,
  n_diff): it explains a failing comparison -- the rows of one (phase, check, quantity,
  detail), one per metric -- only within those bounds, so a known failure cannot hide a
  larger one;
* every failure an entry names must happen, at the level it names it, in every case the entry
  matches where its unit ran: a named quantity (or message) of a check that ran and did not
  fail that way is a strict XPASS naming it ("remove it from entry N") -- whether the check
  passed or failed only in other quantities -- and so is a case that passed, a ``beyond``
  failure whose comparison failed smaller than it names, and an ``up_to`` failure whose
  failing rows lack the metric it bounds (no size measured: nothing it could explain); a
  failure marked ``strict: false`` (a value-dependent symptom) explains a row but need not
  happen; a unit that did not run (its artifact failed) is not held against the entry;
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
    check and quantity: one Recorder.compare writes one row per metric, and the ranks' rows
    are merged to one per metric -- each the worst rank's, so their details may differ)."""
    groups: dict[tuple, dict] = {}
    for r in bad:
        v = r.get("value")
        g = groups.setdefault((r.get("phase"), r["check"], r["quantity"]), {})
        if isinstance(v, (int, float)):
            g[r.get("metric")] = v
    return [groups[(r.get("phase"), r["check"], r["quantity"])] for r in bad]


def judge(rows: list[dict], status: str = "ok", errors: list[str] = (), entries=()) -> Verdict:
    bad = failing_rows(rows, status, list(errors))
    sizes = comparison_values(bad)
    pairs = [(r, v) for r, v in zip(bad, sizes) if not any(e.explains(r, v) for e in entries)]
    unexplained = [r for r, _ in pairs]
    measured = _measured(rows)
    unmet = [(e, f) for e in entries for f in e.fails
             if f.strict and not any(f.happened(r, v) for r, v in zip(bad, sizes))
             and (_held(f, measured) or any(f.matches(r) for r in bad))]
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
        return Verdict(FAILED_, _message(entries, unexplained, unmet, larger, bad, sizes),
                       unexplained, unmet, coverage)
    return Verdict(XFAILED, "; ".join(f"{e.label}: {e.reason}" for e in entries), [], [],
                   coverage)


def _measured(rows) -> tuple[set, set]:
    """(units that ran to their end, (unit, quantity) measured by units that raised): a unit
    ran when its coverage says so (passed, failed, or xfailed in a recorded run); the case
    itself always ran."""
    ran = {r["check"] for r in rows if r.get("metric") == COVERAGE
           and r["outcome"] in (PASSED, FAILED_, XFAILED)} | {"case"}
    raised = {r["check"] for r in rows if r.get("outcome") == "error"} - {"case"}
    measured = {(r["check"], r["quantity"]) for r in rows if r["check"] in raised & ran
                and r.get("metric") != COVERAGE and r.get("outcome") in ("pass", *FAILED)}
    return ran - raised, measured | {(u, q) for u in raised & ran for q in (None, "error")}


def _held(f, measured) -> bool:
    """A strict failure must happen where its unit ran and measured the quantity it names: a
    unit that ran to its end measured every quantity it has (one it has not cannot fail); a
    unit that raised measured those it has rows of; one that did not run, nothing."""
    whole, some = measured
    return f.check in whole or (f.check, f.quantity) in some


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


def _message(entries, unexplained, unmet, larger=(), bad=(), sizes=()) -> str:
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
        lines.append(f"XPASS: {e.label} names {f} failing, but {_how_unmet(f, bad, sizes)}: "
                     f"remove it from entry {e.number}"
                     + (" or measure again" if f.beyond or f.up_to else ""))
    return "\n".join(lines)


def _how_unmet(f, bad, sizes) -> str:
    """Why a strict failure an entry names did not happen in this case."""
    mine = [(r, v) for r, v in zip(bad, sizes) if f.matches(r)]
    if mine and f.beyond:
        return "it did not fail that much"
    if mine:  # up_to: failed, but no row of its comparison measured the bounded metric
        return (f"its failing rows measure no {', '.join(m for m, _ in f.up_to)} (no size it "
                f"could bound)")
    same = sorted({r["quantity"] for r in bad if r["check"] == f.check})
    if f.check == "case":
        return "the case ran to its end"
    if not same:
        return f"{f.check} ran and passed"
    what = _short(f) + (f" /{f.message}/" if f.message else "")
    return (f"{what} did not fail ({f.check} failed only in "
            f"{', '.join(same[:6])})")


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
