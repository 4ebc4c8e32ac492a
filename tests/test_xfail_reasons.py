"""The xfail reason pytest prints with a case is one line naming the defect: the shipped registry's
entries applied to every case of every shipped scenario, on every backend it runs on, the way the
plugin marks them (plugin/registry_match.py); the measurements stay in each entry's details."""

import textwrap
from pathlib import Path

import pytest

from harness.plugin.registry_match import RegistryMatch
from harness.plugin.selection import ScenarioSelection
from harness.spec import catalog
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario, scenario_paths
from harness.verdict import registry, registry_file
from harness.verdict.registry import REASON_MAX, RegistryError

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
# the versions and GPU the TE entries were measured with: every version-gated entry applies
ENV = {"torch": "2.11.0", "te": "2.20.2", "capability": "9.0"}


class _Item:
    """What RegistryMatch.apply reads and writes of a pytest item."""

    def __init__(self, case):
        self.case, self.marks, self.entries = case, [], []

    def add_marker(self, mark):
        self.marks.append(mark)


def _marked_items():
    names = sorted(scenario_paths(SCENARIOS))
    known = ScenarioSelection(SCENARIOS, names[:1], None, None).known_axes()  # every file's
    reg = registry_file.load(SCENARIOS / "xfails.yaml", known | {"fault"})
    match = RegistryMatch(reg)
    items = []
    for backend in catalog.BACKENDS:
        device = "cuda" if backend == "te" else "cpu"
        for name, path in scenario_paths(SCENARIOS).items():
            spec = load_scenario(path)
            if not spec.supports(backend):
                continue
            for case in expand(spec, backend):  # as ScenarioSelection expands it
                item = _Item(case)
                match.apply(item, device, ENV)
                items.append(item)
    return reg, items


def test_every_printed_xfail_reason_is_one_short_line():
    reg, items = _marked_items()
    marked = [i for i in items if i.marks]
    assert len(marked) > 100, len(marked)  # the TE matrix alone has well over a hundred
    for item in marked:
        [mark] = [m for m in item.marks if m.name == "xfail"]
        reason = mark.kwargs["reason"]
        assert "\n" not in reason and len(reason) <= REASON_MAX, (item.case.id, reason)
        assert reason.startswith("xfail entr"), reason
        assert mark.kwargs["strict"] is True
    # every entry applies to some case here, so every entry's reason was checked above --
    # but those for users' scenarios alone (registry.USER), whose reasons the next test checks
    # (one may apply here too: a shipped scenario no entry names is the USER pattern's, as the
    # calibration scenario's block dp4 -> dp2 cases, which skip on TE at its dims)
    user = {e.number for e in reg.entries if e.match.get("scenario") == [registry.USER]}
    shipped = {e.number for e in reg.entries} - user
    assert shipped == {e.number for i in marked for e in i.entries} - user


def test_shipped_entries_keep_their_measurements_in_details():
    reg = registry_file.load(SCENARIOS / "xfails.yaml",
                             {"recipe", "mesh", "module", "dcp", "reshard", "fixes", "fault"}
                             | set(catalog.EXTRA_AXES))
    for e in reg.entries:
        assert "\n" not in e.reason and len(e.reason) <= REASON_MAX, e.label
        assert len(e.details) > len(e.reason), f"{e.label}: no details"


def test_one_entry_reads_whole_several_are_cut_at_a_word():
    mk = lambda n, r: registry.Entry(number=n, line=1, match={}, reason=r,  # noqa: E731
                                     fails=(registry.Failure("train"),))
    one = mk(9, "DelayedScaling's _extra_state is empty in a fresh model")
    assert registry.xfail_reason([one]) == f"xfail entry 9: {one.reason}"
    many = [mk(n, f"defect number {n} " + "word " * 20) for n in (9, 10, 11)]
    text = registry.xfail_reason(many)
    assert text.startswith("xfail entries 9, 10, 11: defect number 9 ") and text.endswith("...")
    assert len(text) <= REASON_MAX and "\n" not in text and " wor..." not in text


def _load(tmp_path, reason_lines: str, extra: str = ""):
    p = tmp_path / "xfails.yaml"
    p.write_text("entries:\n  - match: {recipe: bf16}\n    fails: {check: train}\n"
                 + textwrap.indent(reason_lines, "    ") + extra)
    return p, registry_file.load(p, {"recipe"})


@pytest.mark.parametrize("reason, what", [
    ("reason: " + "x" * (REASON_MAX + 1) + "\n", f"{REASON_MAX + 1} characters"),
    ("reason: >\n  " + "word " * 40 + "\n", "199 characters"),
    ("reason: |\n  line one\n  line two\n", "several lines"),
])
def test_a_long_or_multiline_reason_is_a_one_line_error(tmp_path, reason, what):
    with pytest.raises(RegistryError) as e:
        _load(tmp_path, reason)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'xfails.yaml'}: line 4: entries[0] (entry 1).reason: "
                          f"{what}; a reason is one line of at most {REASON_MAX}"), msg
    assert "'details'" in msg and "\n" not in msg


def test_details_are_loaded_and_must_be_text(tmp_path):
    _, reg = _load(tmp_path, "reason: short\ndetails: >\n  measured\n  twice\n")
    assert reg.entries[0].details == "measured twice"
    with pytest.raises(RegistryError, match=r"line 5: entries\[0\] \(entry 1\)\.details: must "
                                            r"be text, not list"):
        _load(tmp_path, "reason: short\ndetails: [a]\n")
