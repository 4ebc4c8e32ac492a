"""A test helper: run several processes at once, each wait bounded, none left behind
(tests/test_gather.py, tests/test_concurrent_runs.py)."""

import subprocess


def run_all(argvs: list[list[str]], timeout: float, **popen) -> list[tuple[int, str]]:
    """Start every argv, wait for each up to ``timeout`` seconds (TimeoutExpired otherwise),
    kill whatever still runs; (return code, stdout + stderr) per process."""
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              **popen) for a in argvs]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    return [(p.returncode, out) for p, out in zip(procs, outs)]
