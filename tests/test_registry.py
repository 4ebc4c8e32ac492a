import textwrap

import pytest
import yaml

from harness import registry
from harness.matrix import expand
from harness.registry import RegistryError
from harness.spec import load_scenario

AXES = {"recipe", "mesh", "module", "dcp", "reshard", "fixes"}
ENV = {"torch": "2.13.0", "te": "2.20.2", "capability": "9.0", "device": "cuda"}


@pytest.fixture
def cases(tmp_path):
    doc = dict(name="s", axes=dict(recipe=["fp32", "bf16"], mesh=["dp2", "dp2xtp2"],
                                   module=["LayerNormMLP"], dcp=["sync", "async_thread"],
                                   reshard=["none"], fixes=["all", "no_x"]))
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
          - match: {scenario: s, mesh: "dp2x*", dcp: [async_thread], fixes: no_x}
            reason: broken
            link: https://example.org/1
        """)
    hit = cases["fp32-dp2xtp2-LayerNormMLP-async_thread-none-no_x"]
    e = r.match(hit, "cpu", ENV)
    assert e.number == 1 and e.line == 2
    assert "remove xfail entry 1" in e.xfail_reason() and "https://example.org/1" in e.xfail_reason()
    assert r.match(cases["fp32-dp2xtp2-LayerNormMLP-sync-none-no_x"], "cpu", ENV) is None
    assert r.match(cases["fp32-dp2-LayerNormMLP-async_thread-none-no_x"], "cpu", ENV) is None
    assert r.hits[1] == [hit.id]


def test_version_and_capability_ranges(tmp_path, cases):
    r = reg(tmp_path, """\
        entries:
          - match: {recipe: bf16}
            versions: {te: ">=2.0,<2.21"}
            capability: "<10.0"
            reason: r
        """)
    c = cases["bf16-dp2-LayerNormMLP-sync-none-all"]
    assert r.match(c, "cuda", ENV) is not None
    assert r.match(c, "cuda", {**ENV, "te": "2.21.0"}) is None
    assert r.match(c, "cuda", {**ENV, "capability": "10.0"}) is None
    assert r.match(c, "cpu", {**ENV, "te": None, "capability": None}) is None


def test_overlapping_entries_rejected(tmp_path, cases):
    r = reg(tmp_path, """\
        entries:
          - match: {recipe: bf16}
            reason: a
          - match: {mesh: dp2}
            reason: b
        """)
    with pytest.raises(RegistryError, match="matches xfail entry 1 .* and xfail entry 2"):
        r.match(cases["bf16-dp2-LayerNormMLP-sync-none-all"], "cpu", ENV)


def test_stale_entries(tmp_path, cases):
    r = reg(tmp_path, """\
        entries:
          - match: {scenario: s, recipe: bf16}
            reason: used
          - match: {scenario: s, mesh: dp8}
            reason: never matches
          - match: {scenario: other}
            reason: other scenario, not in this run
        """)
    for c in cases.values():
        r.match(c, "cpu", ENV)
    assert [e.number for e in r.stale({"s"})] == [2]


def test_explains_checks_and_message(tmp_path):
    r = reg(tmp_path, """\
        entries:
          - match: {recipe: bf16}
            fails: {check: reshard, message: "Size mismatch .*exp_avg"}
            reason: r
        """)
    e = r.entries[0]
    assert e.explains("ValueError: Size mismatch between saved torch.Size([64]) for optim.exp_avg",
                      {"reshard"})
    assert not e.explains("Size mismatch ... exp_avg", {"dcp_roundtrip"})
    assert not e.explains("some other error", {"reshard"})


@pytest.mark.parametrize("text, msg", [
    ("entries:\n  - match: {recipe: bf16}\n", "every entry needs a reason"),
    ("entries:\n  - reason: r\n", "must select at least one coordinate"),
    ("entries:\n  - match: {colour: red}\n    reason: r\n", "match.colour: unknown coordinate"),
    ("entries:\n  - match: {recipe: bf16}\n    reason: r\n    versions: {te: 'about 2'}\n",
     "versions.te: not a version range"),
    ("entries:\n  - match: {recipe: bf16}\n    reason: r\n    fails: {message: '('}\n", "bad regex"),
    ("entries:\n  - match: {recipe: bf16}\n    reason: r\n    why: x\n", "unknown field 'why'"),
    ("entries: [unclosed", "not valid YAML"),
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
    r = registry.load(root / "scenarios" / "xfails.yaml", AXES | {"fault", "optimizer"})
    for e in r.entries:
        assert e.reason and e.link, f"{e.label} needs a reason and a link"
