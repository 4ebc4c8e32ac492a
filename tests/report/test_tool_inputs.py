"""Issue 61 items 4-5: every ``python -m harness`` command fails in one line with exit 2 on bad
input and leaves no partial file; ``bench --label`` never overwrites or leaves its folder; an
interrupted run is never a result (drift, rejudge, the dashboard)."""

import os
import textwrap

import pytest
from synth_history import A, B, STEADY, make_case, write_run

from harness.__main__ import main
from harness.report import history
from harness.report.outcomes import outcome


def _steady(report_dir, runs=3):
    for n in range(runs):
        write_run(report_dir, n, [make_case(A, metrics={STEADY: 1e-6}),
                                  make_case(B, metrics={STEADY: 1e-6})])


def _stopped(report_dir, n):
    """A run a SIGTERM cut short: A finished with a value far past its baseline, B never ran."""
    return write_run(report_dir, n, [make_case(A, metrics={STEADY: (5e-5, 1e-4)}),
                                     make_case(B, "interrupted", status="interrupted")])


def _one_error_line(capsys, argv) -> str:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _no_litter(d):
    left = [p for p in d.rglob("*") if p.name.endswith(".tmp")]
    assert not left, left


@pytest.mark.parametrize("where, expected", [
    ("dir", "is a directory; give a file name in it"),
    ("under_file", "is not a directory"),
    ("proc", "cannot write there"),
])
def test_report_out_that_cannot_take_the_file(report_dir, capsys, where, expected):
    _steady(report_dir)
    out = {"dir": report_dir, "under_file": report_dir / "f" / "report.html",
           "proc": "/proc/harness-no-such/report.html"}[where]
    (report_dir / "f").write_text("a file")
    err = _one_error_line(capsys, ["report", "--history", str(report_dir / "history"),
                                   "--out", str(out)])
    assert f"--out {out}" in err and expected in err
    _no_litter(report_dir)


def test_history_that_is_a_file_is_not_a_directory(report_dir, capsys):
    (report_dir / "f").write_text("x")
    err = _one_error_line(capsys, ["drift", "--history", str(report_dir / "f")])
    assert "not a directory" in err


@pytest.mark.parametrize("registry, expected", [
    ("missing", "no such file"),
    ("binary", "not a text file"),
    ("bad_regex", "fails.message: bad regex"),
    ("slow_regex", "fails.message: it repeats a group that itself holds a repeat"),
])
def test_rejudge_with_a_registry_it_cannot_use(report_dir, tmp_path, capsys, registry, expected):
    _steady(report_dir, 1)
    p = tmp_path / f"{registry}.yaml"
    if registry == "binary":
        p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    elif registry != "missing":
        msg = {"bad_regex": "(unclosed", "slow_regex": "(.*.*.*.*.*.*.*)*Z$"}[registry]
        p.write_text(textwrap.dedent(f"""\
            entries:
              - match: {{recipe: bf16}}
                fails: {{check: train, message: '{msg}'}}
                reason: r
            """))
    err = _one_error_line(capsys, ["rejudge", "--history", str(report_dir / "history"),
                                   "--registry", str(p)])
    assert f"{registry}.yaml" in err and expected in err


def test_a_bad_option_is_one_line(capsys):
    err = _one_error_line(capsys, ["drift", "--growth", "abc"])
    assert "argument --growth: invalid positive number value: 'abc'" in err


@pytest.mark.parametrize("label, expected", [
    ("../../x", "must be a plain name"),
    ("a/b", "must be a plain name"),
    ("taken", "already exists (an earlier result); choose another label, or --force"),
])
def test_bench_label_never_overwrites_or_leaves_its_folder(tmp_path, capsys, label, expected):
    out = tmp_path / "bench"
    out.mkdir()
    (out / "taken.json").write_text('{"kept": true}')
    err = _one_error_line(capsys, ["bench", "--label", label, "--out", str(out), "--",
                                   "--scenario", "smoke"])
    assert expected in err
    assert (out / "taken.json").read_text() == '{"kept": true}'
    assert sorted(os.listdir(out)) == ["taken.json"] and not (tmp_path / "x.json").exists()


def test_drift_skips_an_interrupted_latest_run(report_dir, capsys):
    """Before: the stopped run was taken as the latest and printed 'no drift flagged'."""
    _steady(report_dir)
    _stopped(report_dir, 3)
    rc = main(["drift", "--history", str(report_dir / "history")])
    cap = capsys.readouterr()
    assert rc == 0
    assert "skipped run run003-cpu: interrupted (1 of 2 cases did not finish)" in cap.err
    assert "latest run run002-cpu" in cap.out and "run003" not in cap.out


def test_rejudge_does_not_count_interrupted_cases_as_failed(report_dir, tmp_path, capsys):
    _stopped(report_dir, 0)
    write_run(report_dir, 1, [make_case(A, metrics={STEADY: 1e-6})])
    reg = tmp_path / "xfails.yaml"
    reg.write_text("entries: []\n")
    rc = main(["rejudge", "--history", str(report_dir / "history"), "--registry", str(reg)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "skipped run run000-cpu: interrupted" in out
    assert "1 recorded cases judged" in out and "failed" not in out


def test_the_dashboard_shows_interrupted_cases_as_interrupted(report_dir):
    _stopped(report_dir, 0)
    h = history.load(report_dir / "history")
    cases = h.rows[(h.rows["check"] == "case") & (h.rows["metric"] == "duration_s")]
    assert sorted(outcome(o) for o in cases["case_outcome"]) == ["interrupted", "passed"]


def test_the_report_header_counts_interrupted_cases(report_dir, tmp_path):
    """Before: an interrupted case counted as failed in every section of the report."""
    from harness.report import drift, html
    _stopped(report_dir, 0)
    reg = tmp_path / "xfails.yaml"
    reg.write_text("entries: []\n")
    text = html.render(history.load(report_dir / "history"), drift.DriftConfig(), reg)
    assert "1 interrupted" in text and "1 failed" not in text
