"""What runs in the run's rank server (``rank_server.py``) and in what it forks: the preload,
the torchrun agent (``agent_main``) and its ranks (``rank_main``).

torchrun runs a ``-m module`` entry point as a fresh Python whatever ``--start-method`` says; a
*function* entry point it starts through ``multiprocessing`` with that method. The agent is
torchrun itself (``torch.distributed.run``: its arguments, rendezvous, monitoring and shutdown)
with the entry point swapped for a function that runs ``harness.worker`` in a process forked
from the agent -- which was forked from the server after its imports.

Forking is safe only before CUDA is initialized: ``torch.cuda.is_available()`` asks NVML
(``PYTORCH_NVML_BASED_CUDA_CHECK``; the CUDA runtime's answer would leave a forked child unable
to use CUDA) and after the imports the server checks that neither torch nor the library touched
the CUDA driver (TE 2.20.2 does not: its forked ranks run FP8 GEMMs). Where the
imports failed or did, each agent runs torchrun with fresh ranks and says why in its log.
``OMP_NUM_THREADS=1`` (the launches' safe environment) keeps torch's thread pool from starting.
Each forked rank gets a fresh Python's signal handling and ``sys.argv``; the agent prints a line
per rank that ends badly (torchrun's summary of forked ranks names only the first).
"""

from __future__ import annotations

import functools
import gc
import importlib
import multiprocessing
import os
import signal
import sys
import threading
import time

from harness.speed import bytecode_cache
from harness.worker import stager_fork, tether

PRELOAD = ("torch", "torch._dynamo", "torch._inductor.config", "torch.distributed.checkpoint",
           "torch.distributed.checkpoint.state_dict", "torch.distributed.fsdp",
           "torch.distributed.tensor", "torch.distributed.tensor.parallel",
           "torch.distributed.device_mesh", "torch.distributed.run", "torch.optim",
           "harness.worker.main", "harness.worker.runner", "harness.worker.producers",
           "harness.checks.record", "harness.distributed.checkpoint",
           "harness.distributed.gather", "harness.distributed.stager", "harness.distributed.run",
           "harness.worker.stager_fork")
EXIT_LINE = "harness.fork_agent: process {pid} exitcode: {code}"
FRESH_LINE = "harness.fork_agent: {why}; this launch's ranks start as fresh Pythons"
BACKEND_VAR = "HARNESS_SERVER_BACKEND"  # the library the server preloads
PARENT_VAR = "HARNESS_SERVER_PARENT"  # the pid the server is tethered to (pytest)

SERVER_PID: int | None = None  # set in the server; its forked agents inherit it
ERROR: str | None = None  # why the server's processes cannot fork ranks (None: they can)


def cuda_driver_initialized() -> bool:
    """Whether this process called ``cuInit``: before it the driver answers
    ``CUDA_ERROR_NOT_INITIALIZED`` to everything; a process without libcuda mapped has not."""
    with open("/proc/self/maps") as f:
        if "libcuda.so" not in f.read():
            return False
    import ctypes
    count = ctypes.c_int(0)
    return ctypes.CDLL("libcuda.so.1").cuDeviceGetCount(ctypes.byref(count)) == 0


def preload(backend: str) -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    from harness import backends
    backends.get(backend).preload()  # the library under test, as each rank's _init would
    _fill_caches()
    import torch
    if torch.cuda.is_initialized() or cuda_driver_initialized():
        raise RuntimeError("CUDA was initialized while importing the ranks' modules; forked "
                           "ranks could not use it")


def _fill_caches() -> None:
    """What every rank would compute alike, once here: Triton's key (a hash of its files and
    its library, the first thing Inductor's cache asks when a rank compiles TE's fused
    functions; its cost: docs/performance.md, "Small costs"), where it is cached."""
    for where in ("triton.runtime.cache", "triton.compiler.compiler"):
        try:
            triton_key = importlib.import_module(where).triton_key
        except Exception:  # noqa: BLE001 - no Triton (CPU torch) or not there: nothing to fill
            continue
        if hasattr(triton_key, "cache_info"):
            triton_key()
        return


def preload_from_env() -> None:
    """The server's preload (``server_preload.py``): tethered to pytest, then the imports; a
    failure is kept in ``ERROR`` (the server must keep serving: its agents start fresh ranks)."""
    global SERVER_PID, ERROR
    bytecode_cache.follow()  # started with pytest's -B: its imports write the harness's cache
    SERVER_PID = os.getpid()
    parent = os.environ.get(PARENT_VAR)
    tether.tether(int(parent) if parent else None)
    # no collections while importing: nearly every object the imports make stays alive, so a
    # collection only walks them
    gc.disable()
    try:
        preload(os.environ.get(BACKEND_VAR, "torch"))
    except BaseException as e:  # noqa: BLE001 - reported by every agent, never fatal here
        ERROR = f"the rank server's imports failed ({type(e).__name__}: {e})"
    # the imported objects move to the collector's permanent generation: a forked process's
    # collections neither walk them nor write to their pages (copy-on-write)
    gc.freeze()
    gc.enable()


def _detach(env: dict, log: str, cwd: str) -> None:
    """The forked agent becomes a launch's process: a session of its own (the launch's
    processes are its session), tethered to the server, the server's alive pipe closed (only
    pytest holds it, so the server ends with pytest), the launch's directory, output and
    environment, and temporary files in the launch's TMPDIR."""
    os.setsid()
    tether.tether(SERVER_PID)
    from multiprocessing import forkserver
    fd = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if fd is not None:
        os.close(fd)
        forkserver._forkserver._forkserver_alive_fd = None
    os.chdir(cwd)
    stager_fork.adopt(env, log)
    os.environ[tether.PARENT_VAR] = str(os.getpid())  # what the ranks must see as parent


def agent_main(torchrun_args: list[str], env: dict, log: str, cwd: str) -> None:
    """A launch's torchrun agent, forked from the server (``rank_server.start_agent``)."""
    if ERROR is not None:  # fresh ranks; their stagers spawn as DCP's do
        env = {k: v for k, v in env.items() if k != stager_fork.SERVER_VAR}
    _detach(env, log, cwd)
    if ERROR is not None:
        print(FRESH_LINE.format(why=ERROR), file=sys.stderr, flush=True)
        os.execve(sys.executable, [sys.executable, "-m", "torch.distributed.run",
                                   *torchrun_args], dict(os.environ))
    import torch.distributed.run as torchrun
    args = torchrun.parse_args(torchrun_args)
    torchrun.elastic_launch = functools.partial(_forking_launch, torchrun.elastic_launch)
    stop = threading.Event()
    threading.Thread(target=_watch_exits, args=(stop,), daemon=True).start()
    try:
        torchrun.run(args)  # raises when a rank failed: the agent exits 1 with its traceback
    finally:
        stop.set()
        sys.stdout.flush()
        sys.stderr.flush()


def rank_main(*cmd_args: str) -> int:
    """The forked rank: ``cmd_args`` are what torchrun would have run after ``python``
    (``-u -m harness.worker --plan PLAN``)."""
    i = cmd_args.index("-m")
    from harness.worker import main as worker
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):  # not the agent's handlers
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    worker._T_MAIN = time.time()  # the rank's process is up (its imports are the server's)
    sys.argv = [worker.__file__, *cmd_args[i + 2:]]
    return worker.main(list(cmd_args[i + 2:]), hard_exit=False)  # torchrun waits for it


def _watch_exits(stop: threading.Event, period_s: float = 0.02) -> None:
    """Print every forked rank that ends with a non-zero status (``EXIT_LINE``; the launcher
    maps the pid to its rank through the ranks' progress files)."""
    known, told = {}, set()
    while not stop.is_set():
        for p in multiprocessing.active_children():  # (reaps the ended ones)
            known[p.pid] = p
        for pid, p in known.items():
            if pid not in told and p.exitcode not in (None, 0):
                told.add(pid)
                print(EXIT_LINE.format(pid=pid, code=p.exitcode), file=sys.stderr, flush=True)
        stop.wait(period_s)


def _forking_launch(elastic_launch, config, entrypoint):
    config.start_method = "fork"
    return elastic_launch(config=config, entrypoint=rank_main)
