import textwrap

import pytest
import yaml

from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario
from harness.verdict import registry, registry_file
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
    return registry_file.load(p, AXES)


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
    assert registry.xfail_reason([e]) == "xfail entry 1: broken"
    assert e.link == "https://example.org/1"
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
        registry_file.load(p, AXES)
    assert msg in str(e.value) and str(p) in str(e.value)


def test_missing_file_is_an_error_unless_missing_ok(tmp_path):
    # a typo in --xfail-registry must not load an empty registry (strict xfails off unnoticed)
    with pytest.raises(RegistryError, match=r"nope.yaml: no such file"):
        registry_file.load(tmp_path / "nope.yaml", AXES)
    with pytest.raises(RegistryError, match=r": not a file"):
        registry_file.load(tmp_path, AXES)
    # the default <scenario-dir>/xfails.yaml may be absent (a scenario dir without one)
    assert registry_file.load(tmp_path / "nope.yaml", AXES, missing_ok=True).entries == []


def test_unreadable_file_is_an_error(tmp_path):
    p = tmp_path / "xfails.yaml"
    p.write_bytes(b"entries: []\n\xff\xfe")
    with pytest.raises(RegistryError, match=r"xfails.yaml: not a text file"):
        registry_file.load(p, AXES)


ENTRY = "  - match: {recipe: bf16}\n    fails: {check: train}\n    reason: r\n"


@pytest.mark.parametrize("text, msg", [
    # safe_load kept the later key without a word: the entry matched fp32, not bf16
    ("entries:\n  - match: {recipe: bf16}\n    match: {recipe: fp32}\n"
     "    fails: {check: train}\n    reason: r\n",
     "line 3: duplicate key 'match' (first at line 2); a mapping may name each key once"),
    ("entries:\n" + ENTRY + "entries:\n" + ENTRY,
     "line 5: duplicate key 'entries' (first at line 1)"),
    ("entries:\n  - match: {recipe: bf16, recipe: fp32}\n    fails: {check: train}\n"
     "    reason: r\n", "line 2: duplicate key 'recipe'"),
    ("entries:\n" + ENTRY + ENTRY + "    why: x\n",
     "line 8: entries[1] (entry 2): unknown field 'why'; allowed: capability, details, "
     "evidence, fails, link, match"),
    ("entries:\n" + ENTRY + "entires: []\n", "line 5: unknown top-level key 'entires'"),
    ("entries:\n" + ENTRY.replace("{check: train}", "{check: train, up_to: {max_abs: 1e-3}}"),
     "line 3: entries[0] (entry 1).fails.up_to.max_abs: must be a number >= 0, not '1e-3' "
     "(YAML 1.1 reads 1e-3 as text, not a number: write it with a dot and a signed exponent, "
     "e.g. 1.0e-3)"),
    ("entries:\n" + ENTRY.replace("bf16}", "bf16, colour: red}"),
     "line 2: entries[0] (entry 1).match.colour: unknown coordinate"),
])
def test_strict_registry_one_line_with_file_and_line(tmp_path, text, msg):
    p = tmp_path / "xfails.yaml"
    p.write_text(text)
    with pytest.raises(RegistryError) as e:
        registry_file.load(p, AXES)
    assert str(e.value).startswith(f"{p}: ") and "\n" not in str(e.value), str(e.value)
    assert msg in str(e.value), str(e.value)


def test_shipped_registry_loads():
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    from harness.spec import catalog
    r = registry_file.load(root / "scenarios" / "xfails.yaml", AXES | set(catalog.EXTRA_AXES))
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


def test_entries_whose_cases_were_deselected_are_not_stale(tmp_path, cases):
    """A -k subset of a scenario (issue 61): the entries of the cases it left out matched no
    case of the run, but select cases of the scenario's matrix -- not stale. Only an entry
    that selects nothing of the matrix is."""
    r = reg(tmp_path, """\
        entries:
          - match: {scenario: s, recipe: bf16}
            fails: {check: train}
            reason: its cases were deselected
          - match: {scenario: s, mesh: dp8}
            fails: {check: train}
            reason: never matches
        """)
    ran = [c for c in cases.values() if c.recipe == "fp32"]
    for c in ran:
        r.match(c, "cpu", ENV)
    matrix = [registry.coords(c, "cpu") for c in cases.values()]
    assert [e.number for e in r.stale({"s"}, matrix=matrix)] == [2]


def test_an_entry_of_another_device_is_neither_matched_nor_stale(tmp_path, cases):
    """``device: cpu``: a failure measured on CPU only (the torch backend's bf16 LayerNormLinear
    update norms; on a GPU its cases pass) -- a GPU run neither expects it nor calls it stale."""
    r = reg(tmp_path, """\
        entries:
          - match: {scenario: s, device: cpu, recipe: bf16}
            fails: {check: train}
            reason: CPU only
        """)
    c = cases["bf16-dp2-LayerNormMLP-sync-none-all"]
    assert r.match(c, "cuda", ENV) == []
    gpu = [registry.coords(x, "cuda") for x in cases.values()]
    assert r.stale({"s"}, matrix=gpu) == []
    [e] = r.match(c, "cpu", ENV)
    assert e.number == 1
    assert r.stale({"s"}, matrix=[registry.coords(x, "cpu") for x in cases.values()]) == []


def test_labels_name_the_registry_file_it_came_from(tmp_path, cases):
    """Issue 61: an XPASS of an entry of known.yaml was labeled "xfails.yaml"."""
    p = tmp_path / "known.yaml"
    p.write_text("entries:\n  - match: {recipe: bf16}\n    fails: {check: train}\n    reason: r\n")
    [e] = registry_file.load(p, AXES).entries
    assert e.label == "xfail entry 1 (known.yaml line 2)"
    assert registry.xfail_reason([e]) == "xfail entry 1: r"  # pytest's one line


def test_an_unknown_quantity_is_refused_at_load(tmp_path):
    """Issue 61: ``update_normz`` was accepted and surfaced later as an XPASS."""
    p = tmp_path / "xfails.yaml"
    p.write_text("entries:\n  - match: {recipe: bf16}\n"
                 "    fails: {check: fp32_parity, quantity: update_normz}\n    reason: r\n")
    with pytest.raises(RegistryError) as e:
        registry_file.load(p, AXES)
    assert ("xfails.yaml: line 3: entries[0] (entry 1).fails.quantity: fp32_parity reports no "
            "quantity 'update_normz' (did you mean 'update_norms'?); its quantities: ") in str(e.value)


@pytest.mark.parametrize("quantity", ["update_norms", "error", "time", "fc.same_tensor"])
def test_known_quantities_load(tmp_path, quantity):
    check = "tied_weights" if quantity.endswith("same_tensor") else "fp32_parity"
    p = tmp_path / "xfails.yaml"
    p.write_text(f"entries:\n  - match: {{recipe: bf16}}\n"
                 f"    fails: {{check: {check}, quantity: {quantity}}}\n    reason: r\n")
    assert registry_file.load(p, AXES).entries[0].fails[0].quantity == quantity


def test_the_catalog_lists_every_quantity_a_check_reports():
    """Every ``rec.compare / flag / measure / note(CHECK, "quantity", ...)`` under harness/
    with a literal quantity names one catalog.CHECK_QUANTITIES knows (else a registry entry
    naming it would be refused)."""
    import ast
    import fnmatch
    from pathlib import Path

    from harness.spec import catalog
    names = {"NAME": "sharding_invariance", "CHECK_NAME": "tied_weights"}
    found = set()
    for path in (Path(__file__).resolve().parent.parent / "harness").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("compare", "flag", "measure", "note")
                    and len(node.args) >= 2):
                continue
            a, q = node.args[:2]
            check = a.value if isinstance(a, ast.Constant) else names.get(getattr(a, "id", ""))
            if check in catalog.CHECKS and isinstance(q, ast.Constant):
                found.add((check, q.value))
    assert len(found) > 30
    unknown = sorted((c, q) for c, q in found if q not in catalog.EVERY_UNIT_QUANTITIES
                     and not any(fnmatch.fnmatchcase(q, p) for p in catalog.CHECK_QUANTITIES[c]))
    assert unknown == []
