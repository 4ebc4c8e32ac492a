"""``python -m harness rejudge``: recorded runs judged against the registry as it is now."""

import json
import textwrap

import pandas as pd

from harness.report import rejudge
from harness.verdict import registry_file

AXES = {"recipe", "mesh", "module", "dcp", "reshard"}


def _rows(case_id, outcome, loss):
    base = dict(run_id="r1", case_id=case_id, scenario="s", backend="te", device="cuda",
                axes=json.dumps({"recipe": "delayed", "mesh": "dp2"}), case_outcome=outcome,
                case_status="ok", te_version="2.20.2", torch_version="2.11", phase="reshard")
    return [dict(base, check="reshard", quantity="*", metric="coverage", value=float("nan"),
                 row_outcome="failed", detail=""),
            dict(base, check="reshard", quantity="next_loss", metric="max_abs", value=loss,
                 row_outcome="fail", detail=f"max_abs={loss}"),
            dict(base, check="case", quantity="time", metric="duration_s", value=1.0,
                 row_outcome="info", detail="")]


def test_a_bound_that_a_recorded_case_exceeds_changes_its_verdict(tmp_path):
    p = tmp_path / "xfails.yaml"
    p.write_text(textwrap.dedent("""\
        entries:
          - match: {recipe: delayed}
            fails: {check: reshard, quantity: next_loss, up_to: {max_abs: 1.0e-3}}
            reason: measured <= 5e-4
        """))
    reg = registry_file.load(p, AXES)
    rows = pd.DataFrame(_rows("small", "xfailed", 4e-4) + _rows("large", "xfailed", 2e-3))
    cases, sizes = rejudge.rejudge(rows, reg)
    now = {c["case_id"]: c["now"] for c in cases}
    assert now == {"small": "xfailed", "large": "failed"}
    large = next(c for c in cases if c["case_id"] == "large")
    assert "reshard/next_loss max_abs 0.002 > 0.001 (entry 1)" in large["message"]
    assert sizes == {(1, "reshard/next_loss max_abs<=0.001"): {("<=", "max_abs"): (4e-4, 1e-3,
                                                                              "small")}}


def _compare(case_id, value, tol, outcome, backend="torch", module="LayerNormMLP", loss=None):
    base = dict(run_id="r2", case_id=case_id, scenario="s", backend=backend, device="cpu",
                axes=json.dumps({"recipe": "bf16", "mesh": "dp2"}), recipe="bf16", mesh="dp2",
                module=module, case_outcome="passed" if outcome == "pass" else "failed",
                case_status="ok", te_version=None, torch_version="2.11", phase="train",
                check="fp32_parity", quantity="params", tolerance=tol, row_outcome=outcome,
                detail="", config="C", **({"loss": loss} if loss is not None else {}))
    return [dict(base, metric="max_abs", value=value), dict(base, metric="rel_l2", value=value)]


def test_today_s_tolerances_rejudge_numbers_only_comparisons():
    """--tolerances: a comparison judged by its numbers takes today's tolerance (here 2x a p99
    of 0.01 = 0.02); one that failed within its recorded tolerance (a shape mismatch, diverged
    replicas) keeps its failure; no population -> fails, but a comparison judged bitwise keeps
    its verdict (no population judges it)."""
    from harness.report import retolerance
    pop = ("torch", "cpu", "gloo", "C", "2", "LayerNormMLP")
    measured = {("fp32_parity", "params", "bf16", "mse") + pop + (m,): dict(n=10, p99=0.01,
                                                                         max=0.01)
                for m in ("max_abs", "rel_l2")}
    bitwise = [dict(r, check="sharding_invariance", tolerance=0.0, tolerance_source="bitwise")
               for r in _compare("bitwise", 0.0, 0.0, "pass", module="Other", loss="mse")]
    rows = pd.DataFrame(_compare("tighter", 0.03, 0.07, "pass")
                        + _compare("wider", 0.015, 0.01, "fail")
                        + _compare("structural", 0.001, 0.07, "fail")
                        + _compare("nowhere", 0.001, 0.07, "pass", module="Other", loss="mse")
                        + bitwise)
    new, changed = retolerance.apply(rows, measured)
    got = new.groupby("case_id")["row_outcome"].agg(set).to_dict()
    assert got == {"tighter": {"fail"}, "wider": {"pass"}, "structural": {"fail"},
                   "nowhere": {"fail"}, "bitwise": {"pass"}}  # no population: bitwise stands
    assert changed == 3
    assert set(new.loc[new["case_id"] == "wider", "tolerance"]) == {0.02}


def test_a_scenario_s_own_model_is_judged_by_the_loss_it_trained_with():
    """--tolerances: the population of a row is that of its recorded loss (a scenario's own
    regression model: mse, not the next-token models' cross-entropy); an older row of such a
    model, with no loss recorded, keeps its recorded tolerance and outcome."""
    from harness.report import retolerance
    pop = ("torch", "cpu", "gloo", "C", "2", "*")
    measured = {("fp32_parity", "params", "bf16", loss) + pop + (m,): dict(n=10, p99=p99, max=p99)
                for loss, p99 in (("mse", 0.01), ("cross_entropy", 0.1))
                for m in ("max_abs", "rel_l2")}
    rows = pd.DataFrame(_compare("own_mse", 0.05, 0.07, "pass", module="Mine", loss="mse")
                        + _compare("own_ce", 0.05, 0.07, "pass", module="Mine",
                                   loss="cross_entropy")
                        + _compare("own_old", 0.05, 0.07, "pass", module="Mine"))
    new, changed = retolerance.apply(rows, measured)
    got = new.groupby("case_id")["row_outcome"].agg(set).to_dict()
    assert got == {"own_mse": {"fail"}, "own_ce": {"pass"}, "own_old": {"pass"}}
    assert changed == 1
    rel = new[new["metric"] == "rel_l2"]
    tol = rel.groupby("case_id")["tolerance"].agg(set).to_dict()
    assert tol == {"own_mse": {0.02}, "own_ce": {0.2}, "own_old": {0.07}}
