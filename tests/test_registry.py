import textwrap

import pytest
import yaml

from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario
from harness.verdict import registry
from harness.verdict.registry import RegistryError

AXES = {"recipe", "mesh", "module", "dcp", "reshard", "fixes"}
ENV = {"torch": "2.13.0", "te": "2.20.2", "capability": "9.0", "device": "cuda"}


@pytest.fixture
def cases(tmp_path):
    doc = dict(name="s", axes=dict(recipe=["fp32", "bf16"], mesh=["dp2", "dp2xtp2"],
                                   module=["LayerNormMLP"], dcp=["sync", "async_thread"],
                                   reshard=["none"], fixes=["all", "no_amax_reduction_group"]))
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc))
    return {c.label: c for c in expand(load_scenario(p))}


def reg(tmp_path, text):
    p = tmp_path / "xfails.yaml"
    p.write_text(textwrap.dedent(text))
    return registry.load(p, AXES)


def test_match_by_axes_globs_and_lists(tmp_path, cases):
    r = reg(tmp_path, """\
        entries:
          - match: {scenario: s, mesh: "dp2x*", dcp: [async_thread], fixes: no_amax_reduction_group}
            fails: {check: dcp_roundtrip}
            reason: broken
            link: https://example.org/1
        """)
    hit = cases["fp32-dp2xtp2-LayerNormMLP-async_thread-none-no_amax_reduction_group"]
    [e] = r.match(hit, "cpu", ENV)
    assert e.number == 1 and e.line == 2
    assert "remove xfail entry 1" in e.xfail_reason() and "https://example.org/1" in e.xfail_reason()
    assert r.match(cases["fp32-dp2xtp2-LayerNormMLP-sync-none-no_amax_reduction_group"], "cpu", ENV) == []
    assert r.match(cases["fp32-dp2-LayerNormMLP-async_thread-none-no_amax_reduction_group"], "cpu", ENV) == []
    assert r.hits[1] == [hit.id]


def test_version_and_capability_ranges(tmp_path, cases):
    r = reg(tmp_path, """\
        entries:
          - match: {recipe: bf16}
            versions: {te: ">=2.0,<2.21"}
            capability: "<10.0"
            fails: {check: train}
            reason: r
        """)
    c = cases["bf16-dp2-LayerNormMLP-sync-none-all"]
    assert r.match(c, "cuda", ENV) != []
    assert r.match(c, "cuda", {**ENV, "te": "2.21.0"}) == []
    assert r.match(c, "cuda", {**ENV, "capability": "10.0"}) == []
    assert r.match(c, "cpu", {**ENV, "te": None, "capability": None}) == []


def test_overlapping_entries_naming_one_check_rejected(tmp_path, cases):
    r = reg(tmp_path, """\
        entries:
          - match: {recipe: bf16}
            fails: {check: reshard, message: a}
            reason: a
          - match: {mesh: dp2}
            fails: [{check: train}, {check: reshard}]
            reason: b
        """)
    with pytest.raises(RegistryError, match="matches xfail entry 1 .* and xfail entry 2 .*"
                                            "both name reshard"):
        r.match(cases["bf16-dp2-LayerNormMLP-sync-none-all"], "cpu", ENV)


def test_entries_naming_different_checks_both_apply(tmp_path, cases):
    r = reg(tmp_path, """\
        entries:
          - match: {recipe: bf16}
            fails: {check: load, message: "_extra_state"}
            workaround: load_without_extra_state
            reason: a
          - match: {mesh: dp2}
            fails: {check: dcp_roundtrip, quantity: state}
            reason: b
        """)
    got = r.match(cases["bf16-dp2-LayerNormMLP-sync-none-all"], "cpu", ENV)
    assert [e.number for e in got] == [1, 2]
    assert got[0].workaround == "load_without_extra_state"


def test_stale_entries(tmp_path, cases):
    r = reg(tmp_path, """\
        entries:
          - match: {scenario: s, recipe: bf16}
            fails: {check: train}
            reason: used
          - match: {scenario: s, mesh: dp8}
            fails: {check: train}
            reason: never matches
          - match: {scenario: other}
            fails: {check: train}
            reason: other scenario, not in this run
        """)
    for c in cases.values():
        r.match(c, "cpu", ENV)
    assert [e.number for e in r.stale({"s"})] == [2]


def _row(check, quantity="error", detail=""):
    return dict(check=check, quantity=quantity, metric="exception", outcome="error",
                detail=detail)


def test_explains_exactly_the_named_failures(tmp_path):
    r = reg(tmp_path, """\
        entries:
          - match: {recipe: bf16}
            fails:
              - {check: reshard_load, message: "Size mismatch .*exp_avg"}
              - {check: dcp_roundtrip, quantity: state}
            reason: r
        """)
    e = r.entries[0]
    assert e.explains(_row("reshard_load", detail="ValueError: Size mismatch between saved "
                                                  "torch.Size([64]) for optim.exp_avg"))
    assert not e.explains(_row("reshard", detail="Size mismatch ... exp_avg"))  # other check
    assert not e.explains(_row("reshard_load", detail="some other error"))  # other message
    assert e.explains(_row("dcp_roundtrip", "state", "anything"))
    assert not e.explains(_row("dcp_roundtrip", "next_loss", "anything"))  # other quantity


@pytest.mark.parametrize("text, msg", [
    ("entries:\n  - match: {recipe: bf16}\n", "every entry needs a reason"),
    ("entries:\n  - match: {recipe: bf16}\n    reason: r\n", "every entry names how its cases fail"),
    ("entries:\n  - match: {recipe: bf16}\n    reason: r\n    fails: {check: dcp_rountrip}\n",
     "fails.check: unknown check 'dcp_rountrip'; allowed: train"),
    ("entries:\n  - match: {recipe: bf16}\n    reason: r\n    fails: {check: load, msg: x}\n",
     "fails: unknown key 'msg'"),
    ("entries:\n  - match: {recipe: bf16}\n    reason: r\n    fails: [{check: load}, {check: load}]\n",
     "is named twice"),
    ("entries:\n  - match: {recipe: bf16}\n    reason: r\n    fails: {check: load}\n"
     "    workaround: reboot\n", "workaround: unknown workaround 'reboot'"),
    ("entries:\n  - match: {recipe: bf16}\n    reason: r\n    fails: {check: train}\n"
     "    workaround: load_without_extra_state\n", "the entry's fails must name one of them"),
    ("- match: {recipe: bf16}\n  reason: r\n", "must be a mapping with one key, 'entries'"),
    ("entries: []\nentires: []\n", "unknown top-level key 'entires'"),
    ("entries:\n  - reason: r\n", "must select at least one coordinate"),
    ("entries:\n  - match: {colour: red}\n    reason: r\n", "match.colour: unknown coordinate"),
    ("entries:\n  - match: {recipe: bf16}\n    reason: r\n    versions: {te: 'about 2'}\n",
     "versions.te: not a version range"),
    ("entries:\n  - match: {recipe: bf16}\n    reason: r\n    fails: {check: train, message: '('}\n",
     "bad regex"),
    ("entries:\n  - match: {recipe: bf16}\n    reason: r\n    fails: {check: train}\n    why: x\n",
     "unknown field 'why'"),
    ("entries: [unclosed", "not valid YAML"),
    ("entries:\n  - match: {recipe: bf16}\n    reason: r\n    fails: {check: load, strict: no}\n",
     "every failure is strict: false; an entry must name at least one failure that must happen"),
    ("entries:\n  - match: {recipe: bf16}\n    reason: r\n    fails: {check: load, strict: 0}\n",
     "fails.strict: must be true or false, not 0"),
])
def test_bad_entries(tmp_path, text, msg):
    p = tmp_path / "xfails.yaml"
    p.write_text(text)
    with pytest.raises(RegistryError) as e:
        registry.load(p, AXES)
    assert msg in str(e.value) and str(p) in str(e.value)


def test_missing_file_is_empty(tmp_path):
    assert registry.load(tmp_path / "nope.yaml", AXES).entries == []


def test_shipped_registry_loads():
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    from harness.spec import catalog
    r = registry.load(root / "scenarios" / "xfails.yaml", AXES | set(catalog.EXTRA_AXES))
    for e in r.entries:
        assert e.reason and e.link, f"{e.label} needs a reason and a link"


def test_entries_naming_disjoint_quantities_of_one_check_both_apply(tmp_path, cases):
    r = reg(tmp_path, """\
        entries:
          - match: {recipe: bf16}
            fails: {check: dcp_roundtrip, quantity: state, message: "_extra_state"}
            reason: amax history lost
          - match: {recipe: bf16}
            fails: [{check: dcp_roundtrip, quantity: cached_buffers}, {check: weights_only_load}]
            reason: stale transpose cache
          - match: {recipe: bf16, mesh: dp2xtp2}
            fails: {check: dcp_roundtrip}
            reason: overlaps both above on dp2xtp2
        """)
    assert [e.number for e in r.match(cases["bf16-dp2-LayerNormMLP-sync-none-all"], "cpu", ENV)] \
        == [1, 2]
    with pytest.raises(RegistryError, match="both name dcp_roundtrip/state"):
        r.match(cases["bf16-dp2xtp2-LayerNormMLP-sync-none-all"], "cpu", ENV)
