"""Fixes and mutants in one table: does each check still catch the bug it exists for?

Two switches make a known bug come back: the reference backend's ``fixes: no_<fix>`` (our own
copy of a TE fix switched off) and the te backend's ``mutation: no_<fix>`` (the installed TE
patched at run time, ``backends/te_mutations.py``). For every such case this pairs it with the
same coordinates with the bug absent (``fixes: all`` / ``mutation: none``) and says:

* caught   -- a check's quantity failed that the clean case's own result did not fail -- or
              that it failed only as its xfail entries explain while the bug's case fails it
              beyond them (a new message, or a known failure grown beyond the size its entry
              bounds, ``up_to``); the checks are listed. What the clean case fails unexplained
              catches nothing. (Runs without the plugin's ``new_vs_clean`` rows -- older
              history -- : its (phase, check, quantity) passes in the clean case, or, for an
              error, its message differs.)
* crashed / timed out -- the case's run crashed or timed out (its status): no check caught
              anything, whatever rows it left; its own verdict, outside the score;
* masked   -- every failure is one the clean case has too (a known failure, e.g. TE's
              DelayedScaling ``_extra_state`` load) and measured values differ: the bug changed
              the run, but only checks that already fail could have seen it -- the known
              failure blinds the harness on these coordinates;
* survived -- nothing failed, but measured values differ from the clean case's: the bug changed
              the run and no check saw it (a blind check) -- also where every value moved no
              more than the clean case's reruns move it (``mutation: rerun`` / ``rerun2``;
              DelayedScaling is not deterministic run to run): within noise is no evidence of
              no effect, and the evidence says so;
* ineffective -- the evidence that nothing measured moved: no new failure, the same measured
              values as the clean case, every one equal.

The mutation score of a backend (and TE version) is caught / (caught + masked + survived).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

from harness.checks.outcomes import FAILED
from harness.verdict.registry import CLEAN_VALUE

SWITCHES = CLEAN_VALUE  # axis -> value meaning "no bug injected"


def _values(rows) -> dict:
    """Measured values of a case (not its timings: those differ from run to run anyway)."""
    out = {}
    for r in rows:
        if r.get("outcome") in ("pass", "fail", "info") and r.get("metric") not in (
                "coverage", "note", "seconds", NEW_VS_CLEAN) and r.get("quantity") != "time":
            v = r.get("value")
            if isinstance(v, float) and math.isnan(v):
                continue
            out[(r.get("phase"), r["check"], r["quantity"], r["metric"])] = v
    return out


def _failures(rows) -> dict:
    """(phase, check, quantity) -> messages of the failed rows there. Only an error's first
    line is kept, its numbers blanked: a numeric failure's text carries the measured numbers,
    and an error's sizes (a pickled ``_extra_state`` of 42828 vs 42836 bytes) move with any
    change of values -- a bug is caught by a new kind of failure, not by new numbers."""
    out: dict = defaultdict(set)
    for r in rows:
        if r.get("outcome") in FAILED:
            text = str(r.get("detail", "")) if r.get("outcome") == "error" else ""
            lines = text.strip().splitlines()
            first = re.sub(r"\d+", "N", lines[0]) if lines else ""
            out[(r.get("phase"), r["check"], r["quantity"])].add(first)
    return out


def _new_failures(mine: dict, theirs: dict) -> list:
    return [k for k, msgs in mine.items() if k not in theirs or not msgs <= theirs[k]]


NEW_VS_CLEAN = "new_vs_clean"  # metric of the rows naming what the clean twin's entries miss
NO_NEW_FAILURE = "clean_twin"  # the check of that metric's row saying there is nothing new
RERUN = "rerun"  # the clean case run again (rerun, rerun2, ...): their differences are noise
NOISE_FACTOR = 10.0  # a value moved no more than 10x the reruns' move: within noise
CASE = "case"  # the unit of a case's own failure (timeout / crash)
ENDED = {"timeout": "timed_out", "crash": "crashed"}  # status -> verdict of its own


def _new_vs_clean(rows) -> list | None:
    """(phase, check, quantity) of each failure the clean twin's xfail entries do not explain
    (rows the results stage adds, ``results.case_rows.new_vs_clean_rows``); None where a run has none (older
    history, or a run without a registry). A ``case`` row (a timeout / crash) is no check's."""
    marks = [r for r in rows if r.get("metric") == NEW_VS_CLEAN]
    if not marks:
        return None
    return sorted({(r.get("phase"), r["check"], r["quantity"]) for r in marks
                   if r["check"] not in (NO_NEW_FAILURE, CASE)})


def _not_shared(new: list, base: dict | None) -> list:
    """The new failures the clean case's own result does not share: those it did not fail,
    or failed only as its entries explain (its unit's coverage xfailed, not failed)."""
    if base is None:
        return new
    rows = base.get("rows", [])
    failed = {(r.get("phase"), r["check"], r["quantity"]) for r in rows
              if r.get("outcome") in FAILED}
    unexplained = {r["check"] for r in rows
                   if r.get("metric") == "coverage" and r.get("outcome") == "failed"}
    return [k for k in new if k not in failed or k[1] not in unexplained]


def _status(c: dict) -> str:
    """The case's status (ok / error / timeout / crash): given, else from a ``case`` row."""
    if c.get("status"):
        return c["status"]
    for r in c.get("rows", []):
        if r["check"] == CASE and r["quantity"] in ENDED:
            return r["quantity"]
    return "ok"


def _noise(clean: dict, reruns: list[dict]) -> dict:
    """value key -> the largest difference between any two runs of the clean case (the clean
    case and its reruns), for the values that moved between them."""
    runs = [_values(c.get("rows", [])) for c in [clean, *reruns]]
    out: dict = {}
    for i, a in enumerate(runs):
        for b in runs[i + 1:]:
            for k in a.keys() & b.keys():
                if a[k] != b[k]:
                    out[k] = max(out.get(k, 0.0), abs(a[k] - b[k]))
    return out


def _beyond_noise(differ, mine, theirs, noise) -> list:
    """The differing values that moved more than 10x the clean runs' largest move (every one
    of them where no rerun moved it, or there is no rerun)."""
    return [k for k in differ
            if not (k in noise and abs(mine[k] - theirs[k]) <= NOISE_FACTOR * noise[k])]


def _noise_note(differ, mine, theirs, noise) -> str:
    if not noise:
        return ""
    beyond = _beyond_noise(differ, mine, theirs, noise)
    return (f" (the clean case's reruns: {len(differ) - len(beyond)} of {len(differ)} within "
            f"{NOISE_FACTOR:g}x their run-to-run move, {len(beyond)} beyond)")


def _moved(differ, only, mine, theirs, noise) -> str:
    """What moved between the bug's case and the clean case, in words."""
    if differ:
        k = (_beyond_noise(differ, mine, theirs, noise) or differ)[0]
        return (f"{len(differ)} measured values differ, e.g. {k[1]}/{k[2]} {k[3]}: "
                f"{mine[k]:.6g} vs {theirs[k]:.6g}{_noise_note(differ, mine, theirs, noise)}")
    k = sorted(only, key=str)[0]
    return (f"{len(only)} values measured in only one of the two cases (e.g. {k[1]}/{k[2]} "
            f"{k[3]})")


def table(cases: list[dict]) -> list[dict]:
    """``cases``: dicts with scenario, backend, axes (dict), outcome, rows, case_id.
    Returns one row per bug-injected case."""
    clean, reruns, injected = {}, {}, []
    for c in cases:
        ax = c["axes"]
        for axis, off in SWITCHES.items():
            if axis not in ax:
                continue
            key = (c["scenario"], c["backend"], axis,
                   tuple(sorted((k, v) for k, v in ax.items() if k != axis)))
            if ax[axis] == off:
                clean[key] = c
            elif ax[axis].startswith(RERUN):
                reruns.setdefault(key, []).append(c)
            elif ax[axis].startswith("no_"):
                injected.append((key, axis, c))
    out = []
    for key, axis, c in injected:
        rows, base = c.get("rows", []), clean.get(key)
        fails = {k: v for k, v in _failures(rows).items() if k[1] != CASE}
        new = _new_vs_clean(rows)
        if new is None:
            new = _new_failures(fails, _failures(base.get("rows", [])) if base else {})
        new = _not_shared(new, base)
        mine, theirs = _values(rows), _values(base.get("rows", []) if base else [])
        differ = sorted(k for k in mine.keys() & theirs.keys() if mine[k] != theirs[k])
        only = mine.keys() ^ theirs.keys()  # measured in one of the two cases only
        noise = _noise(base, reruns.get(key, [])) if base else {}
        failed = sorted({k[1] for k in new})
        status = _status(c)
        if status in ENDED:
            verdict, failed = ENDED[status], []
            evidence = (f"the case's run ended in a {status} ({len(mine)} values measured before "
                        f"it ended): no check caught the bug")
        elif new:
            verdict, evidence = "caught", ""
        elif base is None:
            verdict, evidence = "survived", "no clean case with the same coordinates to compare"
        elif differ and noise and not _beyond_noise(differ, mine, theirs, noise) and not fails:
            k = max(differ, key=lambda k: abs(mine[k] - theirs[k]) / noise[k])
            verdict = "survived"
            evidence = (f"{len(differ)} measured values differ from the clean case's, none "
                        f"failed, each by at most {NOISE_FACTOR:g}x what the clean case's reruns "
                        f"moved ({len(noise)} values move run to run); the largest, "
                        f"{k[1]}/{k[2]} {k[3]}: {mine[k]:.6g} vs {theirs[k]:.6g}, the reruns "
                        f"moved it {noise[k]:.3g}: no check can tell this bug from noise")
        elif (differ or only) and fails:
            verdict = "masked"
            evidence = (f"fails only what the clean case fails too ({len(fails)} failures, "
                        f"e.g. {'/'.join(map(str, sorted(fails)[0][1:]))}); "
                        + _moved(differ, only, mine, theirs, noise)
                        + ": a known failure hides this bug here")
        elif only and not differ:
            verdict = "survived"
            evidence = _moved(differ, only, mine, theirs, noise) + ", none failed"
        elif differ:
            k = (_beyond_noise(differ, mine, theirs, noise) or differ)[0]
            verdict = "survived"
            evidence = (f"{len(differ)} measured values differ from the clean case's, none "
                        f"failed; e.g. {k[1]}/{k[2]} {k[3]}: {mine[k]:.6g} vs {theirs[k]:.6g}"
                        f"{_noise_note(differ, mine, theirs, noise)}")
        elif not mine:
            verdict = "survived"
            evidence = "no measured values to compare with the clean case's: no evidence"
        else:
            verdict = "ineffective"
            evidence = (f"all {len(mine.keys() & theirs.keys())} measured values equal the "
                        f"clean case's ({base['case_id']})"
                        + (f"; its {len(fails)} failures are the clean case's too" if fails else ""))
        out.append(dict(fix=c["axes"][axis][3:], switch=axis, backend=c["backend"],
                        scenario=c["scenario"], case_id=c["case_id"], outcome=c["outcome"],
                        verdict=verdict, caught_by=", ".join(failed), evidence=evidence,
                        clean_outcome=base["outcome"] if base else "-"))
    return sorted(out, key=lambda r: (r["fix"], r["backend"], r["case_id"]))


def scores(rows: list[dict]) -> dict[str, dict]:
    """backend -> {caught, masked, survived, ineffective, crashed, timed out, score} over the
    table's rows; crashes and timeouts are outside the score (no check caught them)."""
    acc: dict[str, dict] = defaultdict(
        lambda: dict(caught=0, masked=0, survived=0, ineffective=0,
                     **{v: 0 for v in ENDED.values()}))
    for r in rows:
        acc[r["backend"]][r["verdict"]] += 1
    for a in acc.values():
        effective = a["caught"] + a["masked"] + a["survived"]
        a["score"] = a["caught"] / effective if effective else math.nan
    return dict(acc)
