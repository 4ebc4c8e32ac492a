"""The selected cases a stopped run (Ctrl-C / SIGTERM) never reported: each gets the outcome
its finished tasks give it, ``skipped`` where collection skipped it, else ``interrupted``."""

from __future__ import annotations

from types import SimpleNamespace

from harness.launch.interrupt import INTERRUPTED
from harness.verdict import judge as verdict
from harness.verdict import registry


def unfinished(hs, collected: dict):
    """(case id, outcome, info) for each selected case without an outcome in ``collected``
    (case id -> (outcome, info)); ``hs``: the HarnessSession.

    A case whose tasks all finished before the stop (in a launch cut short) gets its real
    outcome; one collection had decided to skip is ``skipped``; the rest are ``interrupted``.
    Under pytest-xdist the controller holds no items and no results: cases it never got a
    report for are ``interrupted``."""
    for cid, item in hs.selected_items.items():
        if cid not in collected:
            yield (cid, *_item_outcome(hs, item))
    for cid, case in hs.selected_cases.items():
        if cid not in collected:
            yield cid, INTERRUPTED, case_info(hs, case)


def _item_outcome(hs, item) -> tuple[str, dict]:
    if item.skip_reason:
        return "skipped", item.info()
    res = hs.scheduler.finished(item.case) if hs.scheduler is not None else None
    if res is None:
        info = item.info()
        info.update(status=INTERRUPTED, summary=SUMMARY)
        return INTERRUPTED, info
    item.result = res
    try:
        outcome, why = _outcome(hs, item, res), ""
    except registry.RegistryError as e:  # an entry's message regex ran past its time limit
        outcome, why = "failed", str(e)
    info = item.info()
    if why:
        info["summary"] = why
    return outcome, info


def _outcome(hs, item, res) -> str:
    """What pytest would have reported (CaseItem.runtest + the strict xfail marker): the
    verdict of the exact xfail semantics."""
    item.verdict = v = verdict.judge(res.rows, res.status, res.errors, item.entries)
    return v.outcome


SUMMARY = "interrupted: the run was stopped (Ctrl-C / SIGTERM) before this case finished"


def case_info(hs, case) -> dict:
    """The per-case dict the plugin's reports carry (CaseItem.info), for an interrupted case
    the xdist controller knows only by id."""
    return dict(run_id=hs.run_id, case_id=case.id, case_key=case.key, scenario=case.scenario,
                backend=case.backend, device=hs.device, axes=[list(a) for a in case.axes],
                repro=hs.repro(SimpleNamespace(case=case)), skip_reason="", xfail_entry=None,
                xfail_reason="", status=INTERRUPTED, seconds=0.0, rows=[], launches=[],
                summary=SUMMARY)
