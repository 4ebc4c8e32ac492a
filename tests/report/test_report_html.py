"""The HTML report: self-contained, every section present, renders in headless Chromium."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from synth_history import D, E, case_id, rich_history  # noqa: F401

from harness.__main__ import main
from harness.report import history, html


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple[Path, str, str]:
    """The report of rich_history, rendered once for this module: (path, html, stderr)."""
    import contextlib
    import io
    tmp = tmp_path_factory.mktemp("rich")
    (tmp / "reports" / "history").mkdir(parents=True)
    reg = rich_history(tmp / "reports")
    out = tmp / "site" / "report.html"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["report", "--history", str(tmp / "reports" / "history"), "--out", str(out),
                     "--registry", str(reg)]) == 0
    return out, out.read_text(), err.getvalue()


def test_report_sections(rendered):
    out, text, err = rendered
    assert "broken.parquet" in err  # named on stderr ...
    assert "broken.parquet" in text  # ... and in the report
    # self-contained: no scripts, no stylesheets or images from elsewhere (plain <a> links to
    # issue trackers are fine: nothing is fetched until clicked)
    assert "<script" not in text and "<link" not in text and "@import" not in text
    assert not re.search(r"""src=["']?(https?:)?//""", text)
    assert "url(" not in text
    # figures are inline SVG: nothing to fetch, every reference inside a figure is local
    assert "<img" not in text
    svgs = re.findall(r"<svg\b.*?</svg>", text, flags=re.S)
    assert 0 < len(svgs) == text.count("<figure>")  # one per figure
    for svg in svgs:
        assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', svg))
    # every internal link has its target, and no id is used twice (not even inside figures)
    all_ids = re.findall(r'\sid="([^"]+)"', text)
    ids = set(all_ids)
    assert len(all_ids) == len(ids), [i for i in ids if all_ids.count(i) > 1]
    targets = set(re.findall(r'href="#([^"]+)"', text))
    assert targets and targets <= ids, targets - ids
    # matrix: every outcome colour, cells link to details
    for o in ("failed", "xpassed", "skipped", "passed"):
        assert f'class="cell o-{o}"' in text, o
    # the fix-verification cell holds 4 cases: coloured by the worst, counts by outcome
    assert re.search(r'class="cell o-failed"><a href="#cell-\d+" title="[^"]*">'
                     r'1 fail<br>1 xfail<br>2 pass</a>', text)
    assert text.count('class="matrix"') >= 4
    assert "pytest --scenario synth -k" in text  # repro
    assert "needs 4 ranks" in text and "max_abs=0.003 (tol 0.0001)" in text
    # what changed: new / removed case of the synth scenario
    assert "new case" in text and case_id("synth", D) in text
    assert f"removed case <code>{case_id('synth', E)}" in text
    # drift alerts: B grew 10x over its baseline at run 5 and is still flagged at run 7+
    assert "series drifted" in text and "grew 10x" in text
    # ledger: the one-line reason, and under it the failures named and the measurements
    assert "TP params lose their DTensor placement on load" in text
    assert re.search(r"<details><summary>details</summary><div class=\"sub\">fails: "
                     r"<code>reshard</code></div><p>measured 12/40 elements differing after a "
                     r"dp2xtp2 -&gt; dp4 reshard</p></details>", text)
    assert "ok: failed as expected" in text
    assert "stale: passes now" in text
    assert "stale: never matched a case" in text
    assert "not exercised: no run of scenario synth, backend te in the history" in text
    # fix verification
    assert 'id="fixes"' in text
    assert "verified: fails without the fix, passes with it" in text
    assert "not verified: passes without the fix" in text
    assert "fails without the fix, but unexpectedly" in text  # no_weights_only_pickle: failed
    assert "12/40 elements differ" in text
    # timing
    assert "torchrun launches of the latest run" in text and "slowest" in text


def test_report_single_run_and_orderings(report_dir, tmp_path):
    from synth_history import A, make_case, write_run
    write_run(report_dir, 0, [make_case(A, metrics={("fp32_parity", "loss", "max_abs"): 0.0})])
    h = history.load(report_dir / "history")
    text = html.render(h)
    assert "first run in the history" in text and "no baseline yet" in text
    assert html.worst(["passed", "skipped", "xfailed"]) == "xfailed"
    assert html.worst(["xfailed", "xpassed"]) == "xpassed"
    assert html.worst(["passed", "weird"]) == "failed"
    assert "ranks started" in text and "?" in text.split("ranks started", 1)[1][:40]  # unknown


def test_the_header_says_how_the_ranks_started(report_dir):
    from synth_history import A, make_case, write_run
    write_run(report_dir, 0, [make_case(A)], rank_start="fork")
    text = html.render(history.load(report_dir / "history"))
    assert "fork (forked from the run's rank server)" in text


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--enable-logging=stderr", "--v=0", "--hide-scrollbars"]


def _chromium(page: Path, tmp_path: Path, shot: Path) -> tuple[str, str]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    p = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}",
                        "--window-size=1400,2000", f"--screenshot={shot}", "--dump-dom",
                        page.resolve().as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout, p.stderr


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]


def test_console_check_catches_errors(tmp_path):
    """Negative control: the console scan sees a script error."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body><p>x</p><script>undefined_fn();</script></body></html>")
    _, err = _chromium(page, tmp_path, tmp_path / "bad.png")
    assert any("undefined_fn" in line for line in _console(err))


def test_report_renders_in_chromium(rendered, tmp_path):
    out = rendered[0]
    shot = tmp_path / "report_screenshot.png"
    dom, err = _chromium(out, tmp_path, shot)
    assert _console(err) == []
    assert 'class="matrix"' in dom and "<svg" in dom and 'id="drift"' in dom
    assert 'class="cell hole"' in dom and 'id="coverage"' in dom
    assert shot.is_file() and shot.stat().st_size > 10_000
    dest = os.environ.get("HARNESS_SCREENSHOT_DIR")
    if dest:
        Path(dest).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(dest) / "report_screenshot.png")


def test_report_and_drift_without_metrics(report_dir, capsys):
    """Only skipped / crashed cases: no metric rows at all."""
    from synth_history import A, B, make_case, write_run
    write_run(report_dir, 0, [make_case(A, "skipped", skip_reason="needs 4 ranks"),
                              make_case(B, "failed", status="timeout",
                                        summary="timed out after 240 s")])
    write_run(report_dir, 1, [make_case(A, "skipped", skip_reason="needs 4 ranks")])
    h = history.load(report_dir / "history")
    text = html.render(h)
    assert "No toleranced metrics" in text and "removed case" in text
    assert main(["drift", "--history", str(report_dir / "history"), "--fail-on-drift"]) == 0
    assert "0 flagged" in capsys.readouterr().out


def test_report_escapes_history_text(report_dir):
    """Text from the history (reasons, details) is escaped: the page shows it, never runs it."""
    from synth_history import A, B, make_case, write_run
    evil = '<script>alert("x")</script> & <b>bold</b>'
    write_run(report_dir, 0, [make_case(A, "skipped", skip_reason=evil),
                              make_case(B, "failed", {("fp32_parity", "loss", "max_abs"):
                                                      (1.0, 1e-4, "fail", evil)},
                                        coverage={"fp32_parity": ("failed", evil)})])
    text = html.render(history.load(report_dir / "history"))
    assert "<script" not in text and "<b>bold</b>" not in text
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in text
    assert 'title="&lt;script&gt;' in text  # the coverage tooltip too
