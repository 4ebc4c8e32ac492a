"""``python -m harness bench`` (harness/report/bench.py): the host's CPU busy share it reports
-- the measure that showed the whole TE matrix on one GPU CPU-bound
(a9e4b78:reports/bench/README.md) -- and a real benchmark run of one case."""

import json
import subprocess
import sys
import time

import pytest
from subprocs import ROOT, harness_env, one_case_scenario

from harness.report import bench

STAT = "cpu  {user} 0 {system} {idle} {iowait} 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"


def _stat(path, user, system, idle, iowait=0):
    tmp = path.with_suffix(".tmp")  # replaced whole: the sampler's thread never reads half
    tmp.write_text(STAT.format(user=user, system=system, idle=idle, iowait=iowait))
    tmp.replace(path)


def test_cpu_busy_share_from_proc_stat(tmp_path):
    stat = tmp_path / "stat"
    _stat(stat, 100, 50, 850, 0)
    a = bench.cpu_times(str(stat))
    assert a == (150, 1000)
    _stat(stat, 400, 150, 1000, 50)  # +300 user, +100 system, +150 idle, +50 iowait
    b = bench.cpu_times(str(stat))
    assert bench.busy_between(a, b) == pytest.approx(400 / 600)  # iowait is not busy
    assert bench.busy_between(b, a) is None  # no time passed: no share
    assert bench.cpu_times(str(tmp_path / "absent")) is None
    (tmp_path / "other").write_text("intr 1 2 3\n")
    assert bench.cpu_times(str(tmp_path / "other")) is None


def test_sampler_records_the_mean_and_a_timeline(tmp_path):
    stat = tmp_path / "stat"
    _stat(stat, 0, 0, 1000)
    with bench.UsageSampler(period_s=0.02, cpu_every_s=0.05, stat=str(stat)) as s:
        for k in range(1, 6):  # every interval 3/4 busy, the last fully busy
            n = len(s.cpu_timeline)
            busy = 300 * k + (100 if k == 5 else 0)
            _stat(stat, busy, 0, 1000 + 100 * k - (100 if k == 5 else 0))
            # the sampler's thread reads it (a reading of an unchanged file adds nothing): no
            # sleep that a loaded CI machine could outlast
            deadline = time.monotonic() + 30
            while len(s.cpu_timeline) == n and time.monotonic() < deadline:
                time.sleep(0.01)
    assert s.cpu_busy_share() == pytest.approx(1600 / 2000)
    assert [v for _, v in s.cpu_timeline] == pytest.approx([0.75] * 4 + [1.0])
    assert [t for t, _ in s.cpu_timeline] == sorted(t for t, _ in s.cpu_timeline)


@pytest.mark.integration
def test_a_benchmark_run_writes_its_figures(tmp_path):
    scen = one_case_scenario(tmp_path, "benched", "one case, benchmarked")
    out = tmp_path / "bench"
    p = subprocess.run([sys.executable, "-m", "harness", "bench", "--label", "one", "--out",
                        str(out), "--no-cache", "--", "-p", "harness.plugin", "--scenario",
                        "benched", "--scenario-dir", str(scen)],
                       cwd=ROOT, env=harness_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    s = json.loads((out / "one.json").read_text())
    assert s["checked"] == 1 and s["outcomes"] == {"passed": 1} and s["pytest_exit"] == 0
    assert s["valid"] and "NOT A BENCHMARK FIGURE" not in p.stdout
    assert s["rank_start"] == "fork" and "ranks fork" in p.stdout  # forked from the rank server
    assert s["gpus"] == 0 and s["checked_per_minute"] > 0
    assert s["task_seconds_known"] == "0 of 1"  # --no-cache: no earlier run's seconds
    assert 0 < s["cpu_busy_share"] <= 1  # a launch of two ranks ran on this host
    assert s["cpu_busy_timeline"] and all(0 <= v <= 1 for _, v in s["cpu_busy_timeline"])
    assert {u["unit"] for u in s["units"]} >= {"train", "save", "load", "fp32_parity"}
    assert "host CPUs busy" in p.stdout
    assert s["host_python_loop_s"] > 0 and "for a Python loop of 3,000,000 steps" in p.stdout


def test_a_train_phase_cases_share_counts_once_in_the_units():
    """Two cases, one of them carrying the other's train phase (a note): train seconds once,
    the reshard phase's own seconds kept."""
    import pandas as pd

    def row(case, phase, check, quantity, metric, value):
        return dict(case_id=case, phase=phase, check=check, quantity=quantity, metric=metric,
                    value=value, case_outcome="passed")
    rows = [row("a", "", "case", "", "duration_s", 3.0),
            row("b", "", "case", "", "duration_s", 4.0),
            row("a", "train", "train", "time", "seconds", 2.0),
            row("b", "train", "train", "time", "seconds", 2.0),
            row("b", "train", "train", "shared_train_phase", "note", float("nan")),
            row("b", "reshard", "reshard", "time", "seconds", 1.0)]
    with bench.UsageSampler(period_s=60, stat="/nonexistent") as usage:
        pass
    s = bench.summarize(pd.DataFrame(rows), {}, 10.0, usage)
    units = {u["unit"]: (u["total_s"], u["count"]) for u in s["units"]}
    assert units == {"train": (2.0, 1), "reshard": (1.0, 1)} and s["checked"] == 2


def test_a_run_with_failures_is_not_a_benchmark_figure():
    """A run whose cases crashed early reported 1,091 checked cases per GPU-minute (forked
    ranks that could not use CUDA,
    a9e4b78:reports/bench/h200x1-te-i32-server-c1-allfork1.json): such a figure is printed marked and written with valid false."""
    s = {"cases": 2, "outcomes": {"failed": 2}, "wall_s": 1.0, "launches": 1, "gpus": 1,
         "checked": 2, "checked_per_gpu_minute": 120.0, "gpu_busy_share": 0.0,
         "checked_per_minute": 120.0, "launch_overhead_share": 0.5, "launch_phases_s": {},
         "units": [], "valid": False, "pytest_exit": 1}
    assert "NOT A BENCHMARK FIGURE: 2 case(s) failed (pytest exit 1)" in bench.render("x", s)
    assert "NOT A BENCHMARK" not in bench.render("x", {**s, "valid": True})


def test_a_launch_s_wait_for_a_task_that_never_came_is_not_its_teardown(tmp_path):
    """A lane's launch lives while its feed may bring a task (the whole TE matrix's 2-rank lanes
    waited 25-30 s for reshards onto their world size): the time from its last task's end to
    its feed's close is ``idle_end``, the rest ``teardown``; neither counts as task time."""
    from harness.launch.launch_dir import phases
    from harness.launch.tasks import task_wall
    (tmp_path / "progress").mkdir()
    for rank, done in ((0, 130.0), (1, 131.0)):
        line = dict(main=101.0, imports=101.0, process_group=102.0, backend=102.5,
                    tasks_done=done)
        (tmp_path / "progress" / f"timeline{rank}.json").write_text(json.dumps(line))
    got = phases(tmp_path, 100.0, 132.0, starts=[103.0, 105.0], ends=[105.0, 110.0])
    assert got == pytest.approx(dict(process_start=1.0, imports=0.0, cuda_context=0.0,
                                     process_group=1.0, backend=0.5, first_task_wait=0.5,
                                     idle_end=21.0, teardown=1.0))
    rec = dict(started=100.0, ended=132.0, phases=got, tasks=2)
    assert task_wall([rec]) == pytest.approx(110.0 - 103.0)
    # a rank that never saw its feed close (killed): what is known counts as teardown
    (tmp_path / "progress" / "timeline1.json").write_text(json.dumps(
        dict(main=101.0, imports=101.0, process_group=102.0, backend=102.5)))
    (tmp_path / "progress" / "timeline0.json").unlink()
    got = phases(tmp_path, 100.0, 132.0, starts=[103.0], ends=[110.0])
    assert got["idle_end"] == 0.0 and got["teardown"] == pytest.approx(22.0)


def test_a_gpu_rank_s_cuda_context_is_a_phase_of_its_own(tmp_path):
    """Ranks sharing a GPU make their CUDA contexts one after another in the driver: that wait
    is ``cuda_context``, not the process groups', and it counts as launch overhead, not task
    time."""
    from harness.launch.launch_dir import phases
    from harness.launch.tasks import task_wall
    (tmp_path / "progress").mkdir()
    for rank, ctx in ((0, 101.2), (1, 102.6)):
        line = dict(main=101.0, imports=101.0, cuda_context=ctx, process_group=ctx + 0.05,
                    backend=ctx + 0.1, tasks_done=110.0)
        (tmp_path / "progress" / f"timeline{rank}.json").write_text(json.dumps(line))
    got = phases(tmp_path, 100.0, 111.0, starts=[102.7], ends=[110.0])
    assert got["cuda_context"] == pytest.approx(1.6)
    assert got["process_group"] == pytest.approx(0.05)
    assert got["backend"] == pytest.approx(0.05)
    rec = dict(started=100.0, ended=111.0, phases=got, tasks=1)
    # the task interval starts after every start-up phase: 100 + 1 + 0 + 1.6 + 0.05 + 0.05 + wait
    assert task_wall([rec]) == pytest.approx(110.0 - 102.7)


@pytest.mark.parametrize("given", [None, "two", "eq"])
def test_the_benchmarked_run_keeps_pytest_s_rootdir_and_cache(tmp_path, given):
    """A report dir passed as its own argument is a path to pytest: the run was rooted there,
    its cache (the task seconds, speed/task_seconds.py) in a fresh temporary directory, and
    bench runs never found an earlier run's seconds ("0 of 502" in every bench run on 1 and 2
    H200s, second runs included)."""
    from _pytest.config.findpaths import determine_setup
    proj, rep = tmp_path / "proj", tmp_path / "elsewhere" / "rep"
    proj.mkdir()
    rep.mkdir(parents=True)
    (proj / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    args = ["-p", "harness.plugin", "--scenario", "smoke"]
    args = args + {None: [], "two": ["--report-dir", str(rep)], "eq": [f"--report-dir={rep}"]
                   }[given]
    found, rest = bench.report_dir_arg(args)
    assert found == (None if given is None else str(rep)) and "--report-dir" not in rest
    argv = bench.pytest_argv(rest, found or str(rep), no_cache=False)
    assert argv.count(f"--report-dir={rep}") == 1 and "-p" in argv

    def rootdir(a):
        return determine_setup(inifile=None, override_ini=None, args=a, rootdir_cmd_arg=None,
                               invocation_dir=proj)[0]
    assert rootdir(argv[3:]) == proj
    assert rootdir(["--report-dir", str(rep)] + rest) != proj  # the bug this avoids


def test_a_run_rooted_in_its_report_dir_says_so(tmp_path):
    """``pytest --report-dir DIR`` (two arguments, DIR outside the project) roots the run in
    DIR: the header says how to keep pytest's cache in the project."""
    rep = tmp_path / "rep"
    rep.mkdir()

    def header(*how):
        p = subprocess.run([sys.executable, "-m", "pytest", "-p", "harness.plugin", "--scenario",
                            "smoke", "--collect-only", *how], cwd=ROOT, env=harness_env(),
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout
    # pytest roots the run in DIR where no ini file sits above it (an ini file in a parent of
    # the test's temporary directory moves the root there: --rootdir states it)
    assert f"give it as --report-dir={rep}" in header("--report-dir", str(rep), "--rootdir",
                                                      str(rep))
    assert "give it as" not in header(f"--report-dir={rep}")


def test_the_gpus_counted_are_those_the_run_may_use():
    """A run under CUDA_VISIBLE_DEVICES=0 on a 2-GPU host is a one-GPU run: its per-GPU figure
    and scaling model count one GPU (they counted every GPU nvidia-smi saw)."""
    every = bench.smi_command(None)
    assert "-i" not in every
    assert bench.smi_command("0") == every + ["-i", "0"]
    assert bench.smi_command(" 1, GPU-ab12 ") == every + ["-i", "1,GPU-ab12"]
    assert bench.smi_command("") is None  # no GPU visible: nothing to sample


def test_a_run_with_no_visible_gpu_samples_none(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with bench.UsageSampler(period_s=60, stat="/nonexistent") as usage:
        pass
    assert not usage.available and usage.gpus() == 0 and usage.gpu_busy_share() is None
