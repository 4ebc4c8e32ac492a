"""Fixes / mutants table: caught, survived (a blind check) or ineffective."""

from harness.verdict import mutation_score


def case(cid, switch, value, outcome, rows, **ax):
    axes = dict(recipe="current", mesh="dp2", **ax, **{switch: value})
    return dict(case_id=cid, scenario="s", backend="te", axes=axes, outcome=outcome, rows=rows)


def row(check, value, outcome="pass", quantity="q", metric="max_abs"):
    return dict(check=check, quantity=quantity, metric=metric, value=value, outcome=outcome,
                phase="train")


def test_caught_survived_ineffective_and_score():
    clean = [row("fp32_parity", 0.01), row("dcp_roundtrip", 0.0)]
    cases = [
        case("clean", "mutation", "none", "passed", clean),
        case("m1", "mutation", "no_quantized_allgather", "xfailed",
             [row("quantized_allgather_parity", 1, "fail", metric="violations"), *clean]),
        case("m2", "mutation", "no_to_copy_keeps_subclass", "xpassed", list(clean)),
        case("m3", "mutation", "no_empty_untyped_storage", "xpassed",
             [row("fp32_parity", 0.02), row("dcp_roundtrip", 0.0)]),
        case("clean_ref", "fixes", "all", "passed", clean, dcp="sync"),
        case("f1", "fixes", "no_weights_only_pickle", "xfailed",
             [row("weights_only_load", 1, "error", metric="exception")], dcp="sync"),
    ]
    cases[-1]["backend"] = cases[-2]["backend"] = "reference"
    t = {r["case_id"]: r for r in mutation_score.table(cases)}
    assert t["m1"]["verdict"] == "caught" and t["m1"]["caught_by"] == "quantized_allgather_parity"
    assert t["m2"]["verdict"] == "ineffective" and "all 2 measured values equal" in t["m2"]["evidence"]
    assert t["m3"]["verdict"] == "survived" and "fp32_parity/q max_abs: 0.02 vs 0.01" in t["m3"]["evidence"]
    assert t["f1"]["verdict"] == "caught" and t["f1"]["switch"] == "fixes"
    assert t["f1"]["clean_outcome"] == "passed"
    s = mutation_score.scores(list(t.values()))
    assert s["te"] == dict(caught=1, masked=0, survived=1, ineffective=1, crashed=0,
                           timed_out=0, score=0.5)
    assert s["reference"]["score"] == 1.0


def test_timings_are_no_evidence_of_an_effect():
    clean = [row("fp32_parity", 0.01), row("train", 0.5, "info", quantity="time", metric="seconds")]
    mutant = [row("fp32_parity", 0.01), row("train", 0.7, "info", quantity="time", metric="seconds")]
    t = mutation_score.table([case("clean", "mutation", "none", "passed", clean),
                              case("m", "mutation", "no_empty_untyped_storage", "xpassed", mutant)])
    assert t[0]["verdict"] == "ineffective" and "all 1 measured values equal" in t[0]["evidence"]


def test_a_known_failure_does_not_count_as_catching_a_bug():
    """The clean case already fails (TE DelayedScaling _extra_state): a mutant that fails the
    same checks with the same messages is masked (values moved) or ineffective, not caught;
    a new failure, or an error with another message, is caught."""
    known = [row("load", 1, "error", quantity="error", metric="exception"),
             row("dcp_roundtrip", 0.5, "fail")]
    known[0]["detail"] = "RuntimeError: Size mismatch: saved 42836 vs 0 for _extra_state"
    clean = [*known, row("fp32_parity", 0.01)]
    moved = [dict(known[0], detail="RuntimeError: Size mismatch: saved 42828 vs 0 for "
                                   "_extra_state\n(other sizes: no new failure)"),
             known[1], row("fp32_parity", 0.03)]
    other_error = [dict(known[0], detail="TypeError: cannot pickle"), known[1],
                   row("fp32_parity", 0.01)]
    cases = [case("clean", "mutation", "none", "xfailed", clean),
             case("same", "mutation", "no_empty_untyped_storage", "xfailed", list(clean)),
             case("moved", "mutation", "no_to_copy_keeps_subclass", "xfailed", moved),
             case("new", "mutation", "no_weights_only_pickle", "xfailed", other_error),
             case("extra", "mutation", "no_quantized_allgather", "xfailed",
                  [*clean, row("quantized_allgather_parity", 1, "fail", metric="violations")])]
    t = {r["case_id"]: r for r in mutation_score.table(cases)}
    assert t["same"]["verdict"] == "ineffective"
    assert "its 2 failures are the clean case's too" in t["same"]["evidence"]
    assert t["moved"]["verdict"] == "masked" and "0.03 vs 0.01" in t["moved"]["evidence"]
    assert t["new"]["verdict"] == "caught" and t["new"]["caught_by"] == "load"
    assert t["extra"]["verdict"] == "caught"
    assert t["extra"]["caught_by"] == "quantized_allgather_parity"
    s = mutation_score.scores(list(t.values()))["te"]
    assert (s["caught"], s["masked"], s["ineffective"], s["score"]) == (2, 1, 1, 2 / 3)


def test_what_the_clean_entries_miss_is_what_caught_it():
    """Rows the plugin adds (``new_vs_clean``): a failure of the same quantity as the clean
    case's known one, grown beyond its registered size, catches the bug; the marker row for
    'nothing new' makes a case that only fails like its clean twin masked, not caught."""
    known = row("reshard", 2e-4, "fail", quantity="next_loss")
    clean = case("clean", "mutation", "none", "xfailed", [known])
    big = case("big", "mutation", "no_to_copy_keeps_subclass", "xfailed",
               [row("reshard", 1.8e-3, "fail", quantity="next_loss"),
                dict(row("reshard", float("nan"), "info", quantity="next_loss"),
                     metric=mutation_score.NEW_VS_CLEAN)])
    small = case("small", "mutation", "no_empty_untyped_storage", "xfailed",
                 [row("reshard", 3e-4, "fail", quantity="next_loss"),
                  dict(row(mutation_score.NO_NEW_FAILURE, float("nan"), "info", quantity="*"),
                       metric=mutation_score.NEW_VS_CLEAN)])
    t = {r["case_id"]: r for r in mutation_score.table([clean, big, small])}
    assert t["big"]["verdict"] == "caught" and t["big"]["caught_by"] == "reshard"
    assert t["small"]["verdict"] == "masked"


def test_a_rerun_of_the_clean_case_tells_noise_from_an_effect():
    """DelayedScaling moves values run to run: a mutant whose values differ from the clean
    case's by at most 10x what a rerun of the clean case moved them is not shown ineffective
    (within noise is no evidence that nothing moved): it survived, and the evidence says no
    check can tell it from noise; one that moves a value more, or a value the rerun did not
    move, survived plainly."""
    clean = case("clean", "mutation", "none", "passed",
                 [row("fp32_parity", 1.0e-3), row("dcp_roundtrip", 0.0, quantity="state")])
    rerun = case("rerun", "mutation", "rerun", "passed",
                 [row("fp32_parity", 1.2e-3), row("dcp_roundtrip", 0.0, quantity="state")])
    noisy = case("noisy", "mutation", "no_empty_untyped_storage", "passed",
                 [row("fp32_parity", 0.9e-3), row("dcp_roundtrip", 0.0, quantity="state")])
    moved = case("moved", "mutation", "no_to_copy_keeps_subclass", "passed",
                 [row("fp32_parity", 5.0e-3), row("dcp_roundtrip", 0.0, quantity="state")])
    other = case("other", "mutation", "no_quantized_allgather", "passed",
                 [row("fp32_parity", 1.0e-3), row("dcp_roundtrip", 1e-9, quantity="state")])
    t = {r["case_id"]: r for r in mutation_score.table([clean, rerun, noisy, moved, other])}
    assert set(t) == {"noisy", "moved", "other"}  # the rerun is no mutant
    assert t["noisy"]["verdict"] == "survived"
    assert "at most 10x what the clean case's reruns moved" in t["noisy"]["evidence"]
    assert "no check can tell this bug from noise" in t["noisy"]["evidence"]
    assert t["moved"]["verdict"] == "survived"  # 4e-3 > 10 x 2e-4
    assert t["other"]["verdict"] == "survived"  # the rerun did not move the state at all


def test_two_reruns_widen_the_noise_to_their_largest_move():
    """A value one rerun happened to leave alone but a second moved: with both, a mutant
    moving it as much is within noise (survived, said so); a value no run of the clean case
    moved is an effect."""
    clean = case("clean", "mutation", "none", "passed",
                 [row("fp32_parity", 1.0e-3), row("reshard", 0.5, quantity="n")])
    rerun = case("rerun", "mutation", "rerun", "passed",
                 [row("fp32_parity", 1.0e-3), row("reshard", 0.5, quantity="n")])
    rerun2 = case("rerun2", "mutation", "rerun2", "passed",
                  [row("fp32_parity", 1.3e-3), row("reshard", 0.5, quantity="n")])
    mutant = case("m", "mutation", "no_empty_untyped_storage", "passed",
                  [row("fp32_parity", 2.0e-3), row("reshard", 0.5, quantity="n")])
    other = case("o", "mutation", "no_quantized_allgather", "passed",
                 [row("fp32_parity", 1.0e-3), row("reshard", 0.6, quantity="n")])
    one = {r["case_id"]: r for r in mutation_score.table([clean, rerun, mutant, other])}
    assert one["m"]["verdict"] == "survived"  # one rerun: fp32_parity never moved
    both = {r["case_id"]: r for r in mutation_score.table([clean, rerun, rerun2, mutant, other])}
    assert both["m"]["verdict"] == "survived"  # 1e-3 <= 10 x 3e-4: within noise
    assert "tell this bug from noise" in both["m"]["evidence"]
    assert both["o"]["verdict"] == "survived"
    assert "(the clean case's reruns: 0 of 1 within 10x" in both["o"]["evidence"]


def _marks(*keys):
    """The plugin's new_vs_clean rows (items.new_vs_clean_rows) for (check, quantity) keys."""
    nan = float("nan")
    return [dict(row(c, nan, "info", quantity=q), metric=mutation_score.NEW_VS_CLEAN)
            for c, q in keys]


def test_a_crash_or_timeout_is_its_own_verdict_not_caught():
    """Issue 33: a mutant whose run crashed (or timed out) left a synthetic ``case`` failure
    that no clean entry explains -- no check caught anything. Its own verdict, outside the
    score, also where a check's rows before the crash differ."""
    clean = case("clean", "mutation", "none", "passed", [row("fp32_parity", 0.01)])
    crashed = case("crash", "mutation", "no_quantized_allgather", "failed",
                   [row("fp32_parity", 0.01)] + _marks(("case", "crash")))
    hung = case("hang", "mutation", "no_to_copy_keeps_subclass", "failed",
                [row("fp32_parity", 0.03, "fail")] + _marks(("fp32_parity", "q")))
    hung["status"] = "timeout"
    t = {r["case_id"]: r for r in mutation_score.table([clean, crashed, hung])}
    assert (t["crash"]["verdict"], t["crash"]["caught_by"]) == ("crashed", "")
    assert "ended in a crash" in t["crash"]["evidence"]
    assert t["hang"]["verdict"] == "timed_out"
    s = mutation_score.scores(list(t.values()))["te"]
    assert (s["crashed"], s["timed_out"], s["caught"]) == (1, 1, 0)
    assert s["score"] != s["score"]  # nan: nothing effective was measured


def test_a_failure_the_clean_case_shares_catches_nothing():
    """The clean case itself fails fp32_parity/q, unexplained (coverage failed): a mutant
    failing it too, which its clean twin's entries do not explain either, caught nothing
    there. A failure the clean case has only as its entries explain (coverage xfailed), grown
    beyond them in the mutant, still catches it."""
    cov = dict(row("fp32_parity", float("nan"), "failed", quantity="*"), metric="coverage")
    fails = [row("fp32_parity", 0.05, "fail"), row("dcp_roundtrip", 0.0, quantity="state")]
    clean = case("clean", "mutation", "none", "failed", [cov, *fails])
    shared = case("shared", "mutation", "no_quantized_allgather", "failed",
                  [cov, row("fp32_parity", 0.06, "fail"),
                   row("dcp_roundtrip", 0.0, quantity="state")] + _marks(("fp32_parity", "q")))
    t = {r["case_id"]: r for r in mutation_score.table([clean, shared])}
    assert t["shared"]["verdict"] == "masked", t["shared"]
    explained = dict(cov, outcome="xfailed")
    clean["rows"][0] = explained
    t = {r["case_id"]: r for r in mutation_score.table([clean, shared])}
    assert t["shared"]["verdict"] == "caught" and t["shared"]["caught_by"] == "fp32_parity"


def test_ineffective_needs_every_value_measured_and_equal():
    """A mutant that measured fewer values than the clean case (a check's rows missing) is no
    evidence that nothing moved."""
    clean = case("clean", "mutation", "none", "passed",
                 [row("fp32_parity", 0.01), row("dcp_roundtrip", 0.0, quantity="state")])
    fewer = case("fewer", "mutation", "no_empty_untyped_storage", "passed",
                 [row("fp32_parity", 0.01)])
    t = mutation_score.table([clean, fewer])
    assert t[0]["verdict"] == "survived"
    assert "1 values measured in only one of the two cases" in t[0]["evidence"]
