"""The harness's pytest options, checked before anything runs, and the backend a run uses.

Every bad value is one line naming the option, the value and what is allowed (raised as
``pytest.UsageError``: exit status 4, no traceback), e.g.::

    --case-timeout 0: must be a number of seconds > 0 (and <= 86400)
    --work-dir /data/ro: not writable (Read-only file system)
    --report-dir /mnt/full: 0.0 MiB free on its filesystem; a run needs at least 64 MiB there

Before this, ``--case-timeout 0`` and ``--max-world-size 0`` were silently ignored, a negative
timeout reached torch as a socket timeout and ``--nnodes 0`` divided by zero.

``--backend`` left out: a scenario whose axes only name one backend runs on it (say, the
reference-only ``fix_verification``), with a one-line note; if the selection could run on
several and the default (torch) is not one of them, the error prints the commands that work.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import tempfile
from pathlib import Path

import pytest

from harness.launch import disk
from harness.spec import catalog
from harness.speed import layers

MAX_TIMEOUT_S = 86400.0
MAX_NODES = 1024
_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+)):(?P<port>\d+)$")


def _fail(msg: str):
    raise pytest.UsageError(msg)


def _positive_int(config, dest: str, flag: str, hi: int | None = None) -> None:
    v = config.getoption(dest)
    if v is None:
        return
    if v < 1 or (hi is not None and v > hi):
        _fail(f"{flag} {v}: must be an integer >= 1" + (f" and <= {hi}" if hi else ""))


def check_endpoint(value: str) -> None:
    """``host:port`` (``[v6addr]:port``), port 1..65535; UsageError otherwise."""
    m = _HOST_PORT.match(value or "")
    if not m or not 1 <= int(m["port"]) <= 65535:
        _fail(f"--rdzv-endpoint {value!r}: expected HOST:PORT with a port in 1..65535 "
              f"(e.g. node001:29500 or [::1]:29500)")


def validate(config) -> None:
    """Check every harness option's value; raises pytest.UsageError for the first bad one."""
    t = config.getoption("case_timeout")
    if t is not None and not (math.isfinite(t) and 0 < t <= MAX_TIMEOUT_S):
        _fail(f"--case-timeout {t:g}: must be a number of seconds > 0 (and <= "
              f"{MAX_TIMEOUT_S:g})")
    t = config.getoption("model_check_timeout", None)
    if t is not None and not (math.isfinite(t) and 0 < t <= MAX_TIMEOUT_S):
        _fail(f"--model-check-timeout {t:g}: must be a number of seconds > 0 (and <= "
              f"{MAX_TIMEOUT_S:g})")
    if config.getoption("device", None) == "cuda" and not _cuda_available():
        _fail("--device cuda: no CUDA device here (torch.cuda.is_available() is False); use "
              "--device cpu, or --device auto to have the cases that need a GPU skipped")
    _positive_int(config, "max_world_size", "--max-world-size")
    _positive_int(config, "world_size", "--world-size")
    _positive_int(config, "nnodes", "--nnodes", MAX_NODES)
    _positive_int(config, "launches_per_gpu", "--launches-per-gpu", 16)
    if (config.getoption("max_ranks") or 0) < 0:
        _fail(f"--max-ranks {config.getoption('max_ranks')}: expected 0 (no bound) or more")
    check_accelerations(config)
    reg = config.getoption("xfail_registry")
    if reg is not None and not Path(reg).is_file():  # a typo must not turn the xfails off
        _fail(f"--xfail-registry {reg}: {'not a file' if Path(reg).exists() else 'no such file'}"
              f" (an xfail registry is a YAML file with 'entries', like scenarios/xfails.yaml)")
    # (with --nnodes 1 both are unused: a 1-node allocation of ci/slurm/ still runs)
    endpoint, launcher = config.getoption("rdzv_endpoint"), config.getoption("node_launcher")
    if endpoint is not None:
        check_endpoint(endpoint)
    if launcher is not None:
        try:
            argv = shlex.split(launcher)
        except ValueError as e:
            _fail(f"--node-launcher {launcher!r}: not a command line ({e})")
        if not argv:
            _fail("--node-launcher '': expected a command, e.g. \"srun --nodes=2 "
                  "--ntasks-per-node=1\"")


def check_accelerations(config) -> None:
    """``--accelerations`` names layers that exist; ``--rank-start fork`` needs the rank
    server among them."""
    value = config.getoption("accelerations", None) or "all"
    try:
        acc = layers.parse(value)
    except ValueError as e:
        _fail(f"--accelerations {value}: {e}")
    if config.getoption("rank_start", None) == "fork" and "rank_server" not in acc:
        _fail(f"--rank-start fork: forks from the rank server, which --accelerations {value} "
              f"leaves out (add rank_server, or use --rank-start fresh)")


def _cuda_available() -> bool:
    """Asked only for an explicit ``--device cuda``: a run asked to use a GPU that is not
    there is a usage error, not a run of skips that reads as green."""
    import torch
    return torch.cuda.is_available()


def check_writable(flag: str, directory: Path, need: int = 0) -> None:
    """``need`` bytes free on ``directory``'s filesystem (asked of the directory, or of the
    ancestor it would be made in: nothing is created on a full disk), then create
    ``directory`` if needed and write a probe file into it (what the run will do; permission
    bits alone say nothing for root or on a read-only mount). A path that is, or is under, a
    file is "not a directory", said first."""
    at = disk.existing(directory)
    if not at.is_dir():
        _fail(f"{flag} {directory}: not a directory"
              + ("" if at == Path(directory).absolute() else f" ({at} is a file)"))
    short = disk.shortage(directory, need) if need else ""
    if short:
        _fail(f"{flag} {directory}: {short}")
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        if e.errno in disk.NO_SPACE:
            _fail(f"{flag} {directory}: no space left on device")
        _fail(f"{flag} {directory}: not writable ({e.strerror or e})")


def check_dirs(report_dir: Path, work_dir: str | None) -> None:
    """Before anything starts: room and write access in the report dir (launches log there)
    and the work dir (checkpoints; without --work-dir, room where it would be made)."""
    check_writable("--report-dir", report_dir, disk.REPORT_MIN_FREE)
    if work_dir:
        check_writable("--work-dir", Path(work_dir), disk.WORK_MIN_FREE)
        return
    parent = default_work_parent() or tempfile.gettempdir()
    short = disk.shortage(Path(parent), disk.WORK_MIN_FREE)
    if short:
        _fail(f"the work directory's parent {parent} (checkpoints; --work-dir DIR puts them "
              f"elsewhere): {short}")


def choose_backend(given: str | None, specs: dict, names: list[str]) -> tuple[str, str]:
    """(backend, note): ``given``, else the default if every selected scenario can run on it,
    else the one backend they all can run on (the note says so). ``specs``: name -> spec."""
    if given is not None:
        return given, ""
    default = catalog.DEFAULT_BACKEND
    if "all" in names or all(s.supports(default) for s in specs.values()):
        return default, ""
    runs_on = {n: [b for b in catalog.BACKENDS if s.supports(b)] for n, s in specs.items()}
    common = [b for b in catalog.BACKENDS if all(b in bs for bs in runs_on.values())]
    sel = " ".join(f"--scenario {n}" for n in specs)
    if len(common) == 1:
        return common[0], (f"{', '.join(specs)}: the axes name only backend {common[0]!r}; "
                           f"running with --backend {common[0]}")
    if common:
        _fail(f"{sel}: no values for the default backend {default!r}; it runs on "
              f"{', '.join(common)}: " + " or ".join(f"pytest {sel} --backend {b}"
                                                    for b in common))
    _fail(f"{sel}: the scenarios share no backend ("
          + "; ".join(f"{n}: {', '.join(bs) or 'none'}" for n, bs in runs_on.items())
          + "); run them separately, e.g. "
          + "; ".join(f"pytest --scenario {n} --backend {bs[0]}"
                      for n, bs in runs_on.items() if bs))


def default_work_parent(min_free_gb: float = 2.0) -> str | None:
    """Where checkpoints go without --work-dir: RAM-backed /dev/shm when it exists, is
    writable and has room (checkpoint I/O then costs no disk), else the system temp dir."""
    import shutil
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and os.access(shm, os.W_OK) and \
                shutil.disk_usage(shm).free >= min_free_gb * 2**30:
            return str(shm)
    except OSError:
        pass
    return None
