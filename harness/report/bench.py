"""``python -m harness bench``: run scenarios and show where the time goes.

    python -m harness bench --label cpu-smoke -- --scenario smoke
    python -m harness bench --label h200x2-te -- --scenario fsdp2_tp_dcp --backend te

Runs ``pytest <args>`` with a report directory of its own (a benchmark, not a timed test), then
reads that run's history and launch records and prints:

* wall time, cases checked (passed + xfailed + failed), GPUs, and **checked cases per
  GPU-minute** (on CPU: per minute) -- a run with a failed case is marked not a benchmark
  figure (``valid`` false, exit status 1: a failing case may end early);
* the launches' own phases (process start, imports, process group, backend import, waiting
  for the first task, waiting after the last one for a task that never came, teardown) and
  the share of wall time no task ran (launch overhead: the launches' task intervals' union);
* seconds per producer and check (summed over cases, the slowest rank each; a shared train
  phase once), total and per case;
* the GPUs' busy share (``nvidia-smi`` every 0.5 s; the GPUs ``CUDA_VISIBLE_DEVICES`` leaves);
* the host's CPUs' busy share (``/proc/stat``: the mean, a value every 2 s); a core's speed.

``--out DIR`` (default ``reports/bench``) gets ``<label>.json`` with all of it. pytest runs with
its cache, as a user's run does: the scheduler weighs the tasks by their seconds in the last run
on this checkout where the cache has them (the JSON's ``task_seconds_known``); ``--no-cache``
runs without.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd

from harness.calibration import derive
from harness.launch.tasks import END_PHASES, START_PHASES, task_wall
from harness.report import host_speed, outfile, scaling

PHASES = START_PHASES + END_PHASES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--label", required=True, help="name of this measurement (file name)")
    p.add_argument("--out", default="reports/bench", help="where <label>.json goes")
    p.add_argument("--force", action="store_true",
                   help="replace an existing <label>.json (never done without this flag)")
    p.add_argument("--no-cache", action="store_true",
                   help="run pytest without its cache (-p no:cacheprovider): the scheduler then "
                        "has no task seconds of an earlier run (harness/speed/task_seconds.py)")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER,
                   help="after --: the pytest arguments (e.g. --scenario smoke)")


def cpu_times(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy, total) jiffies of all the host's CPUs since boot (idle and iowait are not busy);
    None where there is no such file."""
    try:
        with open(path) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def busy_between(a: tuple[int, int] | None, b: tuple[int, int] | None) -> float | None:
    """The CPUs' busy share between two :func:`cpu_times` readings."""
    if a is None or b is None or b[1] <= a[1]:
        return None
    return (b[0] - a[0]) / (b[1] - a[1])


def smi_command(visible: str | None) -> list[str] | None:
    """nvidia-smi's utilization query of the GPUs the run may use: those ``CUDA_VISIBLE_DEVICES``
    names (indices or UUIDs) where it is set, none where it is empty, else every one."""
    cmd = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
    ids = ",".join(g.strip() for g in (visible or "").split(",") if g.strip())
    return cmd if visible is None else (cmd + ["-i", ids] if ids else None)


class UsageSampler:
    """The GPUs' mean utilization over the run from nvidia-smi (None without GPUs), and the host's
    CPU busy share from ``/proc/stat`` (None without one): the mean and every ``cpu_every_s``."""

    def __init__(self, period_s: float = 0.5, cpu_every_s: float = 2.0, stat: str = "/proc/stat"):
        self.period_s, self.samples, self._stop = period_s, [], threading.Event()
        self.smi = smi_command(os.environ.get("CUDA_VISIBLE_DEVICES"))
        self.available = shutil.which("nvidia-smi") is not None and self.smi is not None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.stat, self.cpu_every_s = stat, cpu_every_s
        self.cpu_timeline: list[tuple[float, float]] = []  # (seconds in, busy share since last)
        self._cpu0 = self._cpu_last = None
        self._t0 = self._t_last = 0.0

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.available:
                try:
                    out = subprocess.run(self.smi, capture_output=True, text=True,
                                         timeout=5).stdout
                    self.samples.append([float(x) for x in out.split()])
                except (OSError, ValueError, subprocess.TimeoutExpired):
                    pass
            if time.monotonic() - self._t_last >= self.cpu_every_s:
                self._cpu_sample()
            self._stop.wait(self.period_s)

    def _cpu_sample(self) -> None:
        now, t = cpu_times(self.stat), time.monotonic()
        share = busy_between(self._cpu_last, now)
        if share is not None:
            self.cpu_timeline.append((round(t - self._t0, 1), round(share, 3)))
        self._cpu_last, self._t_last = now, t

    def __enter__(self):
        self._cpu0 = self._cpu_last = cpu_times(self.stat)
        self._t0 = self._t_last = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)
        self._cpu_sample()

    def cpu_busy_share(self) -> float | None:
        """The host's CPUs' busy share over the whole run."""
        return busy_between(self._cpu0, self._cpu_last)

    def gpu_busy_share(self) -> float | None:
        vals = [v for s in self.samples for v in s]
        return sum(vals) / len(vals) / 100 if vals else None

    def gpus(self) -> int:
        return max((len(s) for s in self.samples), default=0)


def summarize(df: pd.DataFrame, meta: dict, wall: float, usage: UsageSampler,
              t0: float | None = None) -> dict:
    gpus = usage.gpus()
    cases = df[(df["check"] == "case") & (df["metric"] == "duration_s")]
    outcomes = cases["case_outcome"].value_counts().to_dict()
    checked = sum(outcomes.get(o, 0) for o in ("passed", "xfailed", "failed"))
    launches = meta.get("launches", [])
    phases = {p: sum(rec.get("phases", {}).get(p, 0.0) for rec in launches) for p in PHASES}
    busy_wall = task_wall(launches)
    starts = [rec["started"] for rec in launches if rec.get("started")]
    ends = [rec["ended"] for rec in launches if rec.get("ended")]
    session = {}  # pytest's own time before the first launch and after the last one
    if t0 is not None and starts and ends:
        session = dict(before_first_launch_s=round(min(starts) - t0, 2),
                       after_last_launch_s=round(t0 + wall - max(ends), 2))
    t = df[(df["quantity"] == "time") & (df["metric"] == "seconds")]
    t = t[~derive.carried(t, df)]  # a train phase cases share, counted once
    units = (t.groupby(["phase", "check"])["value"].agg(["sum", "count"])
             .sort_values("sum", ascending=False))
    n = max(len(cases), 1)
    return dict(
        wall_s=wall, cases=len(cases), outcomes=outcomes, checked=checked, gpus=gpus,
        checked_per_gpu_minute=(checked / (gpus * wall / 60)) if gpus else None,
        checked_per_minute=checked / (wall / 60),
        launches=len(launches), launch_phases_s=phases, session_s=session,
        launch_overhead_share=max(0.0, 1 - busy_wall / wall) if wall else None,
        gpu_busy_share=usage.gpu_busy_share(),
        cpu_busy_share=usage.cpu_busy_share(),
        cpu_busy_timeline=usage.cpu_timeline,
        units=[dict(phase=ph, unit=u, total_s=round(r["sum"], 3), per_case_s=round(r["sum"] / n, 4),
                    count=int(r["count"])) for (ph, u), r in units.iterrows()],
        device=meta.get("device"), gpu_name=meta.get("gpu_name"), torch=meta.get("torch_version"),
        te=meta.get("te_version"), hostname=meta.get("hostname"), cpu_count=meta.get("cpu_count"),
        rank_start=meta.get("rank_start"), task_seconds_known=meta.get("task_seconds_known"),
        accelerations=meta.get("accelerations"), bytecode=meta.get("bytecode"),
        scaling=scaling.model(meta, session, wall, gpus))


def render(label: str, s: dict) -> str:
    lines = [f"{label}: {s['cases']} cases ({s['outcomes']}) in {s['wall_s']:.1f} s wall, "
             f"{s['launches']} launch(es)" + (f", ranks {s['rank_start']}"
                                             if s.get("rank_start") else "")
             + (f", accelerations {s['accelerations']}" if s.get("accelerations") else "")]
    if not s.get("valid", True):
        lines.append(f"  NOT A BENCHMARK FIGURE: {s['outcomes'].get('failed', 0)} case(s) failed "
                     f"(pytest exit {s.get('pytest_exit')}); a failing case may end early, and "
                     f"'checked' counts it")
    if s["gpus"]:
        lines.append(f"  checked cases per GPU-minute: {s['checked_per_gpu_minute']:.1f} "
                     f"({s['checked']} on {s['gpus']} GPUs); GPU busy share: "
                     f"{s['gpu_busy_share']:.0%}" if s["gpu_busy_share"] is not None else "")
    lines.append(f"  checked cases per minute: {s['checked_per_minute']:.1f}; launch overhead "
                 f"(no task running): {s['launch_overhead_share']:.0%} of wall")
    if s.get("cpu_busy_share") is not None:
        shares = [v for _, v in s["cpu_busy_timeline"]]
        lines.append(f"  host CPUs busy: {s['cpu_busy_share']:.0%} of {s['cpu_count']} over the "
                     f"run; at least 90% in {sum(v >= 0.9 for v in shares)} of {len(shares)} "
                     f"samples; a core: {s.get('host_python_loop_s')} s for a Python loop of "
                     f"{host_speed.LOOP_STEPS:,} steps")
    if s.get("session_s"):
        lines.append("  pytest alone (s): " + ", ".join(f"{k} {v:.1f}"
                                                      for k, v in s["session_s"].items()))
    lines.append("  launch phases (s, summed over launches): " + ", ".join(
        f"{k} {v:.1f}" for k, v in s["launch_phases_s"].items()))
    if s.get("scaling"):
        lines += scaling.render(s["scaling"])
    lines.append("  seconds per producer / check (sum over cases; per case):")
    for u in s["units"]:
        lines.append(f"    {u['phase']:>7} {u['unit']:<28} {u['total_s']:8.2f}  {u['per_case_s']:.3f}")
    return "\n".join(lines)


_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def target(label: str, out: str, force: bool) -> Path:
    """``<out>/<label>.json``, checked before the run: a label is a plain file name (it cannot
    leave ``out``), and an earlier result of that name is kept unless ``force``."""
    if not _LABEL.match(label) or len(label) > 200:
        raise outfile.OutputError(f"--label {label!r}: must be a plain name of letters, digits, "
                                  f"'.', '_' or '-' (it names <label>.json in {out})")
    path = Path(out) / f"{label}.json"
    outfile.check("--out", path)
    if path.exists() and not force:
        raise outfile.OutputError(f"--label {label}: {path} already exists (an earlier "
                                  f"result); choose another label, or --force to replace it")
    return path


def report_dir_arg(pytest_args: list[str]) -> tuple[str | None, list[str]]:
    """The ``--report-dir`` the pytest arguments give (either spelling), the rest without it."""
    out, given, skip = [], None, False
    for i, a in enumerate(pytest_args):
        if skip:
            skip = False
        elif a == "--report-dir" and i + 1 < len(pytest_args):
            given, skip = pytest_args[i + 1], True
        elif a.startswith("--report-dir="):
            given = a.split("=", 1)[1]
        else:
            out.append(a)
    return given, out


def pytest_argv(pytest_args: list[str], report_dir: str, no_cache: bool) -> list[str]:
    """The benchmarked pytest command. The report dir goes as ``--report-dir=DIR``, one
    argument: pytest takes a separate argument naming an existing directory for a path to test
    and roots the run there -- its cache (the task seconds the scheduler weighs by,
    speed/task_seconds.py) then lived in a fresh temporary directory, and no bench run ever
    found an earlier run's seconds."""
    return [sys.executable, "-m", "pytest", f"--report-dir={report_dir}", *pytest_args, "-q"] + (
        ["-p", "no:cacheprovider"] if no_cache else [])


def run(args: argparse.Namespace) -> int:
    pytest_args = [a for a in args.pytest_args if a != "--"]
    if not pytest_args:
        print("give the pytest arguments after --, e.g. -- --scenario smoke", file=sys.stderr)
        return 2
    try:
        dest = target(args.label, args.out, args.force)
    except outfile.OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    given, pytest_args = report_dir_arg(pytest_args)
    loop_s = host_speed.python_loop_s()  # before the run: its processes would slow it
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        report_dir = given or tmp  # a --report-dir in the arguments keeps the run's files
        argv = pytest_argv(pytest_args, report_dir, args.no_cache)
        with UsageSampler() as sampler:
            t0 = time.time()
            rc = subprocess.run(argv, timeout=6 * 3600).returncode
            wall = time.time() - t0
        hist = sorted(Path(report_dir, "history").glob("*.parquet"), key=lambda p: p.stat().st_mtime)
        metas = sorted(Path(report_dir, "runs").glob("*/meta.json"),
                       key=lambda p: p.stat().st_mtime)
        if not hist or not metas:
            print(f"the run wrote no history (pytest exit {rc})", file=sys.stderr)
            return 2
        df = pd.read_parquet(hist[-1])
        meta = json.loads(metas[-1].read_text())
    s = summarize(df, meta, wall, sampler, t0)
    # a run with failures is no benchmark: its figure is printed and written, marked invalid
    s.update(label=args.label, command=" ".join(["pytest", *pytest_args]), pytest_exit=rc,
             valid=rc == 0 and not s["outcomes"].get("failed", 0), host_python_loop_s=loop_s)
    print(render(args.label, s))
    try:
        outfile.write_text("--out", dest, json.dumps(s, separators=(",", ":"), default=str),
                           overwrite=args.force)
    except outfile.OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {dest}")
    return 0 if s["valid"] else 1
