"""Full disks (issue 29): a report or work directory without room is one line before anything
starts, nothing written there; a report dir that fills up during the run fails each case in one
line naming the directory (was: ``INTERNALERROR> OSError: [Errno 28]``, or a ~740-line
traceback per case); reports that cannot be written at the end say so in one line. pytest
in-process (pytester): no launch starts."""

import errno
import os
import time
from pathlib import Path

import pytest

# before pytester's snapshot of sys.modules (see test_bad_inputs.py)
import torch  # noqa: F401
from diskfull import full_dir

from harness.results.run_record import RunRecord

pytest_plugins = ["pytester"]

SCENARIO = """\
name: s
description: full-disk self-test
axes:
  recipe: [fp32]
  mesh: [dp2]
  module: [Linear]
  dcp: [sync]
  reshard: [none]
  fault: [none, raise]
timeout_s: 60
"""
CASES = ("s[fp32-dp2-Linear-sync-none-none]", "s[fp32-dp2-Linear-sync-none-raise]")


def _run(pytester, *args):
    scen = pytester.path / "scen"
    scen.mkdir(exist_ok=True)
    (scen / "s.yaml").write_text(SCENARIO)
    res = pytester.runpytest_inprocess("-p", "harness.plugin", "-p", "no:cacheprovider",
                                       "--scenario", "s", "--scenario-dir", str(scen), *args)
    return res.ret, "\n".join(res.outlines + res.errlines)


@pytest.mark.parametrize("flag, need", [("--report-dir", 64), ("--work-dir", 256)])
def test_a_full_directory_is_one_line_before_anything_starts(pytester, flag, need):
    with full_dir(pytester.path, pytester) as (full, how):
        target = full / "sub"
        ret, out = _run(pytester, flag, str(target))
        left = sorted(p.name for p in full.iterdir())
    assert ret == pytest.ExitCode.USAGE_ERROR, out
    line = next((ln for ln in out.splitlines() if ln.startswith("ERROR: ")), out)
    assert line == (f"ERROR: {flag} {target}: 0.0 MiB free on its filesystem; a run needs at "
                    f"least {need} MiB there"), (how, out)
    assert left in ([], ["filler"]), left  # nothing written there, not even the directory
    assert "Traceback" not in out and "INTERNALERROR" not in out, out


FILLS_UP = """
import errno
import os

import harness.launch.launch_dir as launch_dir

_real = launch_dir.write_plan


def _no_space(d, *args, **kw):  # the report dir filled up after the run started
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(d / "plan.json"))


def pytest_configure(config):
    launch_dir.write_plan = _no_space


def pytest_unconfigure(config):
    launch_dir.write_plan = _real
"""


def test_a_report_dir_filling_up_fails_each_case_in_one_line(pytester):
    pytester.makeconftest(FILLS_UP)
    rep, work = pytester.path / "rep", pytester.path / "work"
    ret, out = _run(pytester, "--report-dir", str(rep), "--work-dir", str(work))
    assert ret == pytest.ExitCode.TESTS_FAILED, out
    (run,) = (rep / "runs").iterdir()
    for cid in CASES:
        assert f"{cid}: no space left on device in {run / 'launches' / 'L001'} (the report " \
               f"dir, --report-dir): the case did not run" in out, out
    assert "Traceback" not in out and "INTERNALERROR" not in out and "Errno" not in out, out
    assert len(out.splitlines()) < 40, out  # not hundreds of lines per case


def test_reports_not_written_on_a_full_disk_is_one_line(tmp_path, monkeypatch):
    import harness.results.write as write

    def no_space(report_dir, *args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                      str(report_dir / "history" / ".x.parquet.tmp"))
    monkeypatch.setattr(write, "write_run", no_space)
    rec = RunRecord(time.time(), tmp_path, True, None)
    rec.write("run", {}, [], Path("xfails.yaml"))
    assert rec.report_error == (f"reports NOT written: no space left on device in "
                                f"{tmp_path / 'history'} (the report dir, --report-dir)")
