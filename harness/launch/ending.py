"""How a launch ends: every process it started killed (bounded, wherever it was reparented),
the GPU memory released, the results of tasks that never finished (a hang's stacks, a crash's
exit statuses and logs, a start that failed), and the launch's record."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

from harness.launch import gpu, launch_dir, procs
from harness.launch.tasks import LaunchRecord, TaskResult

STACK_GRACE_S = 3.0
KILL_WAIT_S = 15.0  # bounded wait for a launch's killed processes to be gone
GPU_RELEASE_S = 30.0  # bounded wait for their GPU memory to be free again


def dump_stacks(d: Path, pids: list[int]) -> None:
    """SIGUSR1 -> each rank's faulthandler writes its threads' stacks; wait until every rank's
    stack file grew, at most ``STACK_GRACE_S``."""
    files = list((d / "stacks").glob("rank*.txt"))
    before = {f: f.stat().st_size for f in files}
    procs.signal_all(pids, signal.SIGUSR1)
    deadline = time.monotonic() + STACK_GRACE_S
    while time.monotonic() < deadline:
        time.sleep(0.1)
        if files and all(f.stat().st_size > n for f, n in before.items()):
            time.sleep(0.2)  # let the last lines land
            return


def end_processes(launch) -> dict:
    """Kill every process of the launch and wait until they are gone (bounded); on GPU,
    wait until they released their GPU memory. Returns what the launch record keeps."""
    for p in launch.agents:  # srun first gets a SIGTERM to forward to the remote nodes
        if launch.settings.gentle_stop:
            procs.terminate_gently(p)
    agents = launch.agent_ids  # pid -> start time, taken when they started
    running = {p.pid for p in launch.agents if p.poll() is None}
    # the ranks this launch's progress files name (pids checked against the plan or the
    # agents' sessions: a stale pid may belong to someone else by now), everything below the
    # agents and in their sessions (ranks forked from the rank server carry its command line
    # and environment, not the launch's tag)
    sessions = procs.in_sessions(agents)
    ranks = [pid for pid in launch_dir.pid_ranks(launch.d)
             if pid in sessions or str(launch.plan_path) in procs.cmdline(pid)]
    extra = {**procs.identities(ranks), **procs.descendants(agents), **sessions,
             **{pid: start for pid, start in agents.items() if pid in running}}
    for pid, start in agents.items():
        procs.kill_group(pid, start)
    killed, leaked = procs.kill_tagged(launch.tag, extra, timeout_s=KILL_WAIT_S)
    for p in launch.agents:
        procs.reap(p)
    held = []
    if launch.settings.device == "cuda":
        held = gpu.wait_released(set(killed) | set(extra) | set(agents), timeout_s=GPU_RELEASE_S)
    if launch.tmp is not None:  # torchrun's log dir, multiprocessing's pymp-*, stagers' files
        shutil.rmtree(launch.tmp, ignore_errors=True)
    return dict(killed=len(killed), leaked=leaked, gpu_held=held)


def _units(by_rank: dict) -> str:
    return ", ".join(f"rank {r} in {u}" for r, u in sorted(by_rank.items())) or "unknown"


def record(launch, start, end, timed_out, cleanup, results, interrupted=False,
            start_failed="") -> None:
    starts = [r.started for r in results.values() if r.started]
    ends = [r.ended for r in results.values() if r.ended]
    overhead = ((min(starts) - start) + (end - max(ends))) if starts else end - start
    launch.on_record(LaunchRecord(
        launch.name, launch.world_size, len(results), end - start, overhead,
        procs.returncode(launch.agents), timed_out, launch.env.get("CUDA_VISIBLE_DEVICES", ""),
        interrupted=interrupted, start_failed=start_failed,
        phases=launch_dir.phases(launch.d, start, end, starts, ends),
        started=start, ended=end, fresh_ranks=launch_dir.started_fresh(launch.d), **cleanup))


def results(launch, start, end, hung, timed_out) -> dict:
    """Each task's result: from the ranks' result files, else timeout / crash."""
    d, name = launch.d, launch.name
    results = launch_dir.collect(d, name, launch.by_name)
    returncode = procs.returncode(launch.agents)
    current = launch_dir.current(d)  # (task, its start, pids) of the task left running
    task_start = current[1] if current else start
    if hung is not None:
        results[hung] = TaskResult(
            name=hung, status="timeout", launch=name, seconds=end - task_start,
            errors={-1: f"timed out after {launch.by_name[hung].case.timeout_s:g} s "
                        f"(case timeout_s); units running: "
                        f"{_units(launch_dir.units(d, hung))}; ranks' Python stacks below"},
            stacks=launch_dir.read_stacks(d), logs=launch_dir.task_logs(d, hung))
    elif len(results) < len(launch.by_name):
        started = current[0] if current else None
        log = launch_dir.tail(d / "torchrun.log")
        if started is not None:
            results[started] = TaskResult(
                name=started, status="crash", launch=name, seconds=end - task_start,
                errors={-1: f"the launch died while this task ran (torchrun exit status "
                            f"{returncode}): "
                            f"{launch_dir.crash_account(d, launch.by_name[started])}; "
                            f"per-rank logs below\n{log}"},
                logs=launch_dir.task_logs(d, started))
        elif not results:
            # a start that timed out is not retried (it would cost the start-up bound again)
            launch.start_failed = not timed_out
            why = "did not start a task within %.0fs" % launch.settings.startup_timeout_s \
                if timed_out else f"exited with status {returncode} before any task started"
            if launch.start_failed and not launch.retry_start:
                why += " (twice in a row: the launch before it failed to start as well)"
            for t in launch.by_name.values():
                results[t.name] = TaskResult(
                    name=t.name, status="crash", launch=name,
                    errors={-1: f"torchrun {why}\n{log}"}, logs=launch_dir.all_logs(d),
                    stacks=launch_dir.read_stacks(d))
    return results
