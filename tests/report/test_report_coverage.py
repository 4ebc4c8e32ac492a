"""The coverage section: its data (counts, holes, per-case statuses), its rendering, and that
coverage rows never count as cases or checks anywhere else in the report."""

import math
import re

import pandas as pd
from report_content import diff, extract, summary
from synth_history import (  # noqa: F401
    NO_TARGET,
    NOT_LOADED,
    A,
    make_case,
    rich_history,
    write_run,
)

from harness.report import drift, history, html
from harness.report.sections import coverage

NAN = math.nan


def _rows(spec) -> pd.DataFrame:
    """(case, recipe, check, status, detail) -> rows as a history holds them: each case also
    has its case row and a check row, which the coverage summary must ignore."""
    out = []
    for case, recipe, check, status, detail in spec:
        out.append(dict(case_id=case, recipe=recipe, check=check, quantity="*",
                        metric="coverage", value=NAN, tolerance=NAN, row_outcome=status,
                        detail=detail))
    for case, recipe in dict.fromkeys((c, r) for c, r, *_ in spec):
        out.append(dict(case_id=case, recipe=recipe, check="case", quantity="",
                        metric="duration_s", value=1.0, tolerance=NAN, row_outcome="passed",
                        detail=""))
        out.append(dict(case_id=case, recipe=recipe, check="fp32_parity", quantity="loss",
                        metric="max_abs", value=0.0, tolerance=1e-4, row_outcome="pass",
                        detail=""))
    return pd.DataFrame(out)


def test_summarize_counts_and_holes():
    load_failed = "not run: needs the dcp load, which failed: CheckpointException"
    rows = _rows([
        ("c1", "fp32", "fp32_parity", "passed", ""),
        ("c1", "fp32", "reshard", "not_run", load_failed),
        ("c2", "fp32", "fp32_parity", "failed", "max_abs=1 (tol 0.1)"),
        ("c2", "fp32", "reshard", "passed", ""),
        ("c3", "nvfp4", "fp32_parity", "xfailed", "xfail entry 12"),
        ("c3", "nvfp4", "reshard", "not_run", load_failed),
        ("c4", "nvfp4", "fp32_parity", "passed", ""),
        ("c4", "nvfp4", "reshard", "not_run", "not run: other reason"),
        ("c4", "nvfp4", "reshard", "passed", ""),  # a repeated row keeps the worst status
    ])
    s = coverage.summarize(rows)
    assert s["checks"] == ["fp32_parity", "reshard"] and s["recipes"] == ["fp32", "nvfp4"]
    assert s["n_cases"] == 4 and [c["case"] for c in s["by_case"]] == ["c1", "c2", "c3", "c4"]
    cells = {(r["check"], rec): c for r in s["by_recipe"] for rec, c in zip(s["recipes"],
                                                                             r["cells"])}
    assert cells["fp32_parity", "fp32"]["counts"] == [("failed", 1), ("passed", 1)]
    assert cells["fp32_parity", "fp32"]["worst"] == "failed"
    assert cells["fp32_parity", "nvfp4"]["counts"] == [("xfailed", 1), ("passed", 1)]
    assert cells["fp32_parity", "nvfp4"]["worst"] == "xfailed"
    assert cells["reshard", "fp32"]["counts"] == [("not_run", 1), ("passed", 1)]
    assert not cells["reshard", "fp32"]["hole"]  # ran once: a gap, not a hole
    hole = cells["reshard", "nvfp4"]
    assert hole["hole"] and hole["counts"] == [("not_run", 2)] and hole["worst"] == "not_run"
    assert s["holes"] == [{"check": "reshard", "recipe": "nvfp4", "n_cases": 2,
                           "reason": load_failed}]
    # check x case: status and reason per cell; c1 has no row for a check it lacks -> None
    assert s["by_case"][0]["cells"] == [{"status": "passed", "detail": ""},
                                        {"status": "not_run", "detail": load_failed}]
    assert s["by_case"][2]["cells"][0] == {"status": "xfailed", "detail": "xfail entry 12"}
    partial = coverage.summarize(rows[~((rows["case_id"] == "c1") & (rows["check"] == "reshard"))])
    assert partial["by_case"][0]["cells"][1] is None


def test_summarize_without_coverage_rows_and_unknown_status():
    rows = _rows([("c1", "fp32", "fp32_parity", "passed", "")])
    assert coverage.summarize(rows[rows["metric"] != "coverage"]) is None
    odd = coverage.summarize(_rows([("c1", "", "dcp_roundtrip", "exploded", "?")]))
    assert odd["recipes"] == ["—"] and odd["by_case"][0]["cells"][0]["status"] == "failed"
    assert coverage.worst(["passed", "not_run", "xfailed"]) == "xfailed"


def _page(tmp_path, cov: bool) -> str:
    d = tmp_path / ("with" if cov else "without")
    d.mkdir()
    reg = rich_history(d, coverage=cov)
    return html.render(history.load(d / "history"), drift.DriftConfig(), reg)


def test_coverage_section_rendered(tmp_path):
    text = _page(tmp_path, cov=True)
    sec = text[text.index('<section id="coverage">'):]
    sec = sec[:sec.index("</section>")]
    assert '<a href="#coverage">Coverage</a>' in text  # in the navigation
    # synth: reshard never runs (reshard=none), weights_only_load never with bf16
    holes = re.findall(r'<td class="cell hole" title="([^"]*)">hole</td>', sec)
    assert sorted(holes) == sorted([NO_TARGET, NO_TARGET, NOT_LOADED])
    assert "<code>weights_only_load</code> never ran with recipe <code>bf16</code>" in sec
    # a gap that is not a hole: weights_only_load ran on one fp32 case
    assert "3 not run<br>1 pass" in sec
    # fixver: the xfailed and failed checks, each with its reason as tooltip
    assert '<td class="cell o-xfailed" title="xfail entry 1">xfail</td>' in sec
    assert '<td class="cell o-failed" title="UnpicklingError: weights only">fail</td>' in sec
    assert "1 xfail<br>3 pass" in sec
    # the check x case table links each case to its details; few cases: open
    assert re.search(r'<td class="case"><a href="#case-\d+"><code>synth\[', sec)
    assert sec.count("<details open>") == 2


def test_coverage_rows_change_no_other_section(tmp_path):
    """Coverage rows (also the worker's "case" unit) are no cases, checks or series."""
    ex = {str(tmp_path / d): "TMP" for d in ("without", "with")}  # the longer one first
    with_cov = summary(extract(_page(tmp_path, cov=True), ex), exclude=("coverage",))
    without = summary(extract(_page(tmp_path, cov=False), ex), exclude=("coverage",))
    assert with_cov["parts"]["details"]["n_tokens"] > 100
    assert diff(without, with_cov) == []


def test_runs_before_coverage_rows(report_dir):
    write_run(report_dir, 0, [make_case(A, metrics={("fp32_parity", "loss", "max_abs"): 0.0})])
    text = html.render(history.load(report_dir / "history"))
    sec = text[text.index('<section id="coverage">'):]
    sec = sec[:sec.index("</section>")]
    assert sec.count("no coverage rows in this run (recorded since schema 2)") == 1
    assert "hole" not in sec.split("</p>", 1)[1]  # only the help text mentions holes
