"""The report shows the same content as the golden extracts under tests/report/golden/.

The goldens were taken with the f-string renderer that preceded the templates, from the committed
GPU history (tests/fixtures/gpu/2xh200-te2.20.2/history, with a frozen copy of the xfail registry those
runs used) and from the synthetic rich history (with a frozen copy of its registry: the ledger
shows entry line numbers). Each compares, per section: heading, visible text tokens (in order and
sorted), tooltips and in-page links; plus the navigation and every anchor id.
The coverage section is new and excluded.

HARNESS_UPDATE_REPORT_GOLDEN=1 rewrites the goldens (only for a change that is meant to change
what the report shows; review the diff).
"""

import json
import os
import shutil
from pathlib import Path

import pytest
from report_content import diff, extract, summary
from synth_history import rich_history

from harness.report import drift, history, html

HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
GPU_HISTORY = HERE.parent / "fixtures" / "gpu" / "2xh200-te2.20.2" / "history"
NEW_SECTIONS = ("coverage",)


def _render(history_dir: Path, registry: Path, tmp: Path) -> dict:
    h = history.load(history_dir)
    # every run must be readable (the synthetic history's broken file is meant to be skipped)
    assert not h.empty and all(p.name == "broken.parquet" for p, _ in h.problems), h.problems
    text = html.render(h, drift.DriftConfig(), registry)
    # no path of the machine that renders: temporary directories, this checkout
    paths = {str(tmp): "TMPDIR", str(GOLDEN): "GOLDEN"}
    return summary(extract(text, paths), exclude=NEW_SECTIONS)


def _check(name: str, got: dict) -> None:
    path = GOLDEN / f"{name}.json"
    if os.environ.get("HARNESS_UPDATE_REPORT_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    want = json.loads(path.read_text())
    problems = diff(want, got)
    assert not problems, "\n".join(problems)


def test_gpu_history_content_unchanged(tmp_path):
    files = sorted(GPU_HISTORY.glob("*.parquet"))
    if not files:
        pytest.skip(f"no committed GPU history under {GPU_HISTORY}")
    hist = tmp_path / "history"
    hist.mkdir()
    for f in files:
        shutil.copy(f, hist)
    got = _render(hist, GOLDEN / "xfails_gpu.yaml", tmp_path)
    assert {"latest", "matrix", "details", "xfails", "fixes", "drift"} <= set(got["sections"])
    _check("gpu_history", got)


def test_synthetic_history_content_unchanged(tmp_path):
    (tmp_path / "reports").mkdir()
    rich_history(tmp_path / "reports")
    got = _render(tmp_path / "reports" / "history", GOLDEN / "xfails_synth.yaml", tmp_path)
    assert {"problems", "changes", "drift-alerts", "fixes", "timing", "runs"} <= set(
        got["sections"])
    _check("synthetic_history", got)


def test_extract_sees_content_changes():
    """Negative control: a changed number, a lost tooltip or a lost anchor is a difference."""
    page = ('<nav><a href="#a">A</a></nav><main><section id="a"><h2>Sec A</h2>'
            '<p title="tip one">3 passed</p><div id="x1">x</div></section></main>')
    base = summary(extract(page))
    assert base["parts"]["a"]["tokens"] == sorted(["Sec", "A", "tip", "one", "3", "passed", "x"])
    assert diff(base, summary(extract(page.replace("<p title", "<div><p title")
                                      .replace("</p>", "</p></div>")))) == []
    for changed in (page.replace("3 passed", "4 passed"), page.replace(' title="tip one"', ""),
                    page.replace(' id="x1"', ""), page.replace("Sec A", "Sec B")):
        assert diff(base, summary(extract(changed))), changed
