"""Exact xfail semantics: an entry explains only the failures it names
(harness/verdict/judge.py)."""

import textwrap

from harness.verdict import judge as verdict
from harness.verdict import registry_file

AXES = {"recipe", "mesh", "module", "dcp", "reshard"}


def entries(tmp_path, text):
    p = tmp_path / "xfails.yaml"
    p.write_text(textwrap.dedent(text))
    return registry_file.load(p, AXES).entries


def cov(unit, status, detail=""):
    return dict(check=unit, quantity="*", metric="coverage", outcome=status, detail=detail,
                phase="train")


def fail(unit, quantity, detail, metric="max_abs"):
    return dict(check=unit, quantity=quantity, metric=metric, outcome="fail", detail=detail,
                phase="train")


def error(unit, detail):
    return dict(check=unit, quantity="error", metric="exception", outcome="error",
                detail=detail, phase="train")


LOAD_ERR = "CheckpointException on ranks [0, 1]: Size mismatch ... for model._extra_state"
# TE delayed scaling with the FSDP2 all-gather hooks removed: the known _extra_state load
# failure, and the all-gather regression it must not hide
ROWS = [cov("train", "passed"), cov("load", "failed", "failed: " + LOAD_ERR),
        error("load", LOAD_ERR),
        cov("quantized_allgather_parity", "passed", "ran"),
        fail("quantized_allgather_parity", "quantized_unshard",
             "weight: unsharded parameter is a plain torch.float32 tensor", "violations"),
        cov("dcp_roundtrip", "not_run", "not run: needs the dcp load, which failed: ...")]
LOAD_ENTRY = """\
    entries:
      - match: {recipe: delayed}
        fails: {check: load, message: "_extra_state"}
        reason: TE 1860
    """


def test_known_failure_does_not_hide_another(tmp_path):
    es = entries(tmp_path, LOAD_ENTRY)
    v = verdict.judge(ROWS, "ok", [], es)
    assert v.outcome == "failed"
    assert "entry 1 explains load" in v.message
    assert "not explained by any entry: quantized_allgather_parity/quantized_unshard" in v.message
    assert v.coverage["load"][0] == "xfailed"
    assert v.coverage["quantized_allgather_parity"][0] == "failed"
    assert v.coverage["dcp_roundtrip"] == ("not_run", "not run: needs the dcp load, which failed: ...")


def test_a_second_entry_naming_the_other_check_makes_it_xfail(tmp_path):
    es = entries(tmp_path, """\
        entries:
          - match: {recipe: delayed}
            fails: {check: load, message: "_extra_state"}
            reason: TE 1860
          - match: {recipe: delayed}
            fails: {check: quantized_allgather_parity, message: "plain torch.float32"}
            reason: hooks removed
        """)
    v = verdict.judge(ROWS, "ok", [], es)
    assert v.outcome == "xfailed", v.message
    assert v.coverage["quantized_allgather_parity"][0] == "xfailed"


def test_message_must_match(tmp_path):
    es = entries(tmp_path, """\
        entries:
          - match: {recipe: delayed}
            fails: {check: load, message: "Unsupported checkpoint format"}
            reason: r
        """)
    v = verdict.judge([cov("load", "failed"), error("load", LOAD_ERR)], "ok", [], es)
    assert v.outcome == "failed" and "not explained by any entry: load/error" in v.message


def test_named_check_that_passes_is_a_strict_xpass(tmp_path):
    es = entries(tmp_path, """\
        entries:
          - match: {recipe: delayed}
            fails: [{check: load}, {check: weights_only_load}]
            reason: r
        """)
    rows = [cov("load", "failed"), error("load", "boom"), cov("weights_only_load", "passed")]
    v = verdict.judge(rows, "ok", [], es)
    assert v.outcome == "failed"
    assert "names weights_only_load failing, but weights_only_load ran and passed: remove it " \
           "from entry 1" in v.message
    # a named check that did not run (its artifact failed) is not held against the entry
    rows[-1] = cov("weights_only_load", "not_run", "not run: ...")
    assert verdict.judge(rows, "ok", [], es).outcome == "xfailed"


def test_non_strict_failure_explains_but_need_not_happen(tmp_path):
    """``strict: false``: a value-dependent symptom explains its row when it happens; when its
    check passes, that is no XPASS -- but it explains nothing else, and the entry's strict
    failure must still happen."""
    es = entries(tmp_path, """\
        entries:
          - match: {recipe: current}
            fails:
              - {check: async_equivalence, quantity: bytes}
              - {check: dcp_roundtrip, quantity: state, strict: false}
            reason: r
        """)
    async_fail = [cov("async_equivalence", "failed"), fail("async_equivalence", "bytes", "x")]
    rows = async_fail + [cov("dcp_roundtrip", "passed", "ran")]
    assert verdict.judge(rows, "ok", [], es).outcome == "xfailed"
    rows = async_fail + [cov("dcp_roundtrip", "failed"), fail("dcp_roundtrip", "state", "y")]
    assert verdict.judge(rows, "ok", [], es).outcome == "xfailed"
    rows = async_fail + [cov("dcp_roundtrip", "failed"), fail("dcp_roundtrip", "next_loss", "z")]
    v = verdict.judge(rows, "ok", [], es)
    assert v.outcome == "failed" and "dcp_roundtrip/next_loss" in v.message
    rows = [cov("async_equivalence", "passed"), cov("dcp_roundtrip", "failed"),
            fail("dcp_roundtrip", "state", "y")]
    v = verdict.judge(rows, "ok", [], es)
    assert v.outcome == "failed" and "remove it from entry 1" in v.message


def test_passing_case_with_an_entry_is_xpassed(tmp_path):
    es = entries(tmp_path, LOAD_ENTRY)
    v = verdict.judge([cov("train", "passed"), cov("load", "passed")], "ok", [], es)
    assert v.outcome == "xpassed" and "remove xfail entry 1" in v.message
    assert verdict.judge([cov("train", "passed")], "ok", [], []).outcome == "passed"


def test_timeout_is_a_case_failure_only_a_case_entry_explains(tmp_path):
    rows = [cov("train", "passed")]
    v = verdict.judge(rows, "timeout", ["timed out after 15s"], [])
    assert v.outcome == "failed" and "case/timeout" in v.message
    es = entries(tmp_path, LOAD_ENTRY)
    assert verdict.judge(rows, "timeout", ["timed out"], es).outcome == "failed"
    es = entries(tmp_path, """\
        entries:
          - match: {recipe: delayed}
            fails: {check: case, message: "timed out"}
            reason: hangs
        """)
    assert verdict.judge(rows, "timeout", ["timed out after 15s"], es).outcome == "xfailed"


def test_every_named_quantity_must_fail_not_just_its_check(tmp_path):
    """Issue 33: an entry naming fp32_parity/params and fp32_parity/update_norms does not
    xfail a case where only update_norms failed -- params is a strict XPASS, by name."""
    es = entries(tmp_path, """\
        entries:
          - match: {recipe: delayed}
            fails:
              - {check: fp32_parity, quantity: params}
              - {check: fp32_parity, quantity: update_norms}
            reason: r
        """)
    only_norms = [cov("fp32_parity", "failed"), fail("fp32_parity", "update_norms", "x")]
    v = verdict.judge(only_norms, "ok", [], es)
    assert v.outcome == "failed", v.message
    assert [(e.number, str(f)) for e, f in v.unmet] == [(1, "fp32_parity/params")]
    assert ("XPASS: xfail entry 1 (xfails.yaml line 2) names fp32_parity/params failing, but "
            "fp32_parity/params did not fail (fp32_parity failed only in update_norms): remove "
            "it from entry 1") in v.message
    both = only_norms + [fail("fp32_parity", "params", "y")]
    assert verdict.judge(both, "ok", [], es).outcome == "xfailed"
    # a message names the failure too: the quantity failing another way does not meet it
    es = entries(tmp_path, """\
        entries:
          - match: {recipe: delayed}
            fails:
              - {check: fp32_parity, quantity: update_norms}
              - {check: fp32_parity, quantity: params_updated, message: "did not move"}
              - {check: fp32_parity, quantity: params, strict: false}
            reason: r
        """)
    moved = both + [fail("fp32_parity", "params_updated", "every parameter moved")]
    v = verdict.judge(moved, "ok", [], es)
    assert v.outcome == "failed" and "params_updated /did not move/ did not fail" in v.message


def test_up_to_on_a_metric_the_failure_did_not_measure_explains_nothing(tmp_path):
    """A bound on n_diff cannot hold for a comparison that measured no n_diff (a toleranced
    one: max_abs and rel_l2 only) or for an error: such a failure is neither explained nor
    met -- before, an absent metric counted as within its bound."""
    es = entries(tmp_path, """\
        entries:
          - match: {recipe: delayed}
            fails: {check: load, up_to: {n_diff: 100}}
            reason: r
        """)
    v = verdict.judge([cov("load", "failed"), error("load", LOAD_ERR)], "ok", [], es)
    assert v.outcome == "failed"
    assert "not explained by any entry: load/error" in v.message
    assert ("names load n_diff<=100 failing, but its failing rows measure no n_diff"
            in v.message)
    rows = [cov("load", "failed"),
            dict(fail("load", "state", "x", "max_abs"), value=0.5),
            dict(fail("load", "state", "x", "rel_l2"), value=0.1)]
    assert verdict.judge(rows, "ok", [], es).outcome == "failed"
    rows.append(dict(fail("load", "state", "x", "n_diff"), value=41))
    assert verdict.judge(rows, "ok", [], es).outcome == "xfailed"
    # one comparison merged over ranks: each metric the worst rank's, details differ
    rows[-1]["detail"] = "x (rank 1)"
    assert verdict.judge(rows, "ok", [], es).outcome == "xfailed"
    rows[-1]["value"] = 262151
    assert verdict.judge(rows, "ok", [], es).outcome == "failed"


def test_a_quantity_its_check_never_measured_is_not_held_against_the_entry(tmp_path):
    """A check that raised before it measured a named quantity (its load failed first) did not
    show the quantity passing: no XPASS. One that ran to its end measured all it has."""
    es = entries(tmp_path, """\
        entries:
          - match: {recipe: delayed}
            fails:
              - {check: weights_only_load, message: "Weights only"}
              - {check: weights_only_load, quantity: rebuilt_buffers, message: "transpose"}
            reason: r
        """)
    raised = [cov("weights_only_load", "failed"), error("weights_only_load", "Weights only ...")]
    assert verdict.judge(raised, "ok", [], es).outcome == "xfailed"
    measured = raised + [dict(fail("weights_only_load", "rebuilt_buffers", "x"), outcome="pass")]
    v = verdict.judge(measured, "ok", [], es)
    assert v.outcome == "failed" and "weights_only_load/rebuilt_buffers" in v.message
