"""A user's own scenario meets the library's known defects as known (``scenario: "@user"``),
and an entry is held only against cases that run a unit its strict failures name.

Found by a QA probe on real TE (2026-11-29): a user's DelayedScaling scenario (dp3, dp3xtp2;
its own name) failed every case that loads -- "Size mismatch between saved torch.Size([42836])
and current: torch.Size([0]) for model._extra_state", TE's known defect -- because the entry
(and its load_without_extra_state workaround) selected four named scenarios only."""

import dataclasses
import textwrap
from pathlib import Path

import yaml

from harness.plugin.registry_match import workarounds
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario
from harness.verdict import judge as verdict
from harness.verdict import registry_file
from harness.worker.runner import planned_units

AXES = {"recipe", "mesh", "module", "dcp", "reshard", "mutation"}
ENV = {"te": "2.20.2"}
ROOT = Path(__file__).resolve().parent.parent
KNOWN = """\
    entries:
      - match: {scenario: [fsdp2_tp_dcp, "@user"], backend: te, recipe: delayed}
        fails:
          - {check: load, message: "_extra_state"}
        workaround: load_without_extra_state
        reason: a library defect
      - match: {scenario: te_mutations, backend: te, mutation: no_x}
        fails: {check: reshard}
        reason: a mutant of one scenario
    """


def _reg(tmp_path):
    p = tmp_path / "xfails.yaml"
    p.write_text(textwrap.dedent(KNOWN))
    return registry_file.load(p, AXES)


def _cases(tmp_path, name, checks):
    doc = dict(name=name, axes=dict(recipe={"te": ["delayed", "current"]}, mesh=["dp3"],
                                    module=["LayerNormMLP"], dcp=["sync"], reshard=["none"]),
               model=dict(batch=12), checks=checks)
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    return {c.recipe: c for c in expand(load_scenario(tmp_path / f"{name}.yaml"), "te")}


def test_user_scenarios_meet_the_librarys_known_defects_with_their_workaround(tmp_path):
    r = _reg(tmp_path)
    mine = _cases(tmp_path, "my_model", ["fp32_parity", "dcp_roundtrip"])
    [e] = r.match(mine["delayed"], "cuda", ENV, planned_units(mine["delayed"]))
    assert e.number == 1 and workarounds([e]) == (("load", "load_without_extra_state"),)
    assert r.match(mine["current"], "cuda", ENV, planned_units(mine["current"])) == []
    # a scenario some entry names is not a user's: it meets only entries that name it
    named = _cases(tmp_path, "te_mutations", ["fp32_parity", "dcp_roundtrip"])
    assert r.match(named["delayed"], "cuda", ENV, planned_units(named["delayed"])) == []


def test_an_entry_is_not_held_against_a_case_that_never_runs_its_units(tmp_path):
    """A user's DelayedScaling case without DCP checks never loads: the load entry would turn
    its pass into a strict XPASS ("remove entry 1") if it applied."""
    r = _reg(tmp_path)
    no_dcp = _cases(tmp_path, "my_model", ["fp32_parity", "sharding_invariance"])["delayed"]
    assert "load" not in planned_units(no_dcp)
    assert r.match(no_dcp, "cuda", ENV, planned_units(no_dcp)) == []
    [e] = r.match(no_dcp, "cuda", ENV)  # units unknown: selected as before
    passed = [dict(check="fp32_parity", quantity="*", metric="coverage", outcome="passed")]
    assert verdict.judge(passed, entries=[e]).outcome == verdict.XPASSED  # what pruning spares
    assert verdict.judge(passed, entries=[]).outcome == verdict.PASSED


def test_planned_units_follow_the_checks_needs():
    cases = expand(load_scenario(ROOT / "scenarios" / "fsdp2_tp_dcp.yaml"), "te")
    resharded = next(c for c in cases if c.ax["reshard"] == "to_dp4")
    units = planned_units(resharded)
    assert {"train", "save", "load", "expected", "reshard_load", "case"} <= units
    only = dataclasses.replace(resharded, checks=("fp32_parity",))
    assert planned_units(only) == {"fp32_parity", "train", "reference", "save", "case"}


def test_shipped_library_entries_select_a_users_delayed_scenario():
    from harness.spec import catalog
    reg = registry_file.load(ROOT / "scenarios" / "xfails.yaml",
                             set(catalog.CORE_AXES) | set(catalog.EXTRA_AXES))
    case = next(c for c in expand(load_scenario(ROOT / "tests" / "scenarios" /
                                                "te_unseen_config.yaml"), "te")
                if c.recipe == "delayed")
    user = dataclasses.replace(case, scenario="my_model",
                               checks=("fp32_parity", "dcp_roundtrip", "async_equivalence"))
    found = reg.match(user, "cuda", {"te": "2.20.2", "torch": "2.11.0"}, planned_units(user))
    assert any(e.workaround == "load_without_extra_state" for e in found)
    assert reg.user("my_model") and not reg.user("fsdp2_tp_dcp")
