"""``python -m harness.fork_agent <torchrun arguments> -m harness.worker --plan PLAN``: torchrun
whose ranks are forked from an agent that imported the worker's modules once.

Every rank of every launch imports torch, DCP, FSDP2, DTensor and dynamo (which the optimizer's
``_disable_dynamo`` wrappers import on first use) before its first case: ~4 CPU-seconds a rank,
measured on a 2-core VM -- a third of the CPU the ``smoke`` scenario uses, and on a small box
CPU is what bounds the wall time. torchrun runs a ``-m module`` entry point as a fresh Python
(``subprocess``) whatever ``--start-method`` says; a *function* entry point it starts through
``multiprocessing`` with that method. This agent is torchrun itself (``torch.distributed.run``:
its own arguments, rendezvous, monitoring and shutdown) with one change: the entry point is a
function that runs ``harness.worker``'s ``main`` in a process forked from this one, after the
modules below were imported here -- each rank then shares them copy-on-write instead of
importing them again.

The agent imports the launch's backend's library too (``HARNESS_PRELOAD_BACKEND``, set by the
launcher: TE for ``--backend te``). Forking is only safe before CUDA or threads that hold locks
exist: the agent imports (its exit watcher thread only polls its children), it runs nothing on
a device, ``OMP_NUM_THREADS=1`` (the launcher's safe environment) keeps torch's thread pool from
starting, ``torch.cuda.is_available()`` asks NVML (asking the CUDA runtime would leave a forked
child unable to use CUDA), and after the imports the agent checks that neither torch nor a
library initialized the CUDA driver (TE 2.20.2 does not). The launcher forks by default on CPU
only (``--rank-start``): on 1x H200 forked ranks with TE imported by the agent gave the same
outcomes and were ready ~2 s sooner, but the run's wall time moved less than run to run (the
ranks then wait for pytest's collection), so GPU launches keep fresh-Python ranks.
Each forked rank gets a fresh Python's signal handling and ``sys.argv``, and names itself
``harness-rank<R>`` (its command line is the agent's).
"""

from __future__ import annotations

import functools
import importlib
import os
import signal
import sys
import threading
import time

# what a rank imports before and during its cases (the library under test's are the backend's)
PRELOAD = ("torch", "torch._dynamo", "torch.distributed.checkpoint",
           "torch.distributed.checkpoint.state_dict", "torch.distributed.fsdp",
           "torch.distributed.tensor", "torch.distributed.tensor.parallel",
           "torch.distributed.device_mesh", "torch.optim",
           "harness.worker.main", "harness.worker.runner", "harness.worker.producers",
           "harness.worker.checkpoint", "harness.worker.gather", "harness.worker.stager",
           "harness.worker.run", "harness.worker.parallel", "harness.checks.record")


PRELOAD_BACKEND_VAR = "HARNESS_PRELOAD_BACKEND"  # the launch's backend: its library too


def cuda_driver_initialized() -> bool:
    """Whether this process called ``cuInit`` (torch's lazy init or a library's own): a forked
    child of such a process cannot use CUDA. Before ``cuInit`` the driver answers
    ``CUDA_ERROR_NOT_INITIALIZED`` to everything; a process without libcuda mapped has not."""
    with open("/proc/self/maps") as f:
        if "libcuda.so" not in f.read():
            return False
    import ctypes
    count = ctypes.c_int(0)
    return ctypes.CDLL("libcuda.so.1").cuDeviceGetCount(ctypes.byref(count)) == 0


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    backend = os.environ.get(PRELOAD_BACKEND_VAR)
    if backend:  # the library under test (TE), as the rank's own backend.preload() would
        from harness import backends
        backends.get(backend).preload()
    import torch
    if torch.cuda.is_initialized() or cuda_driver_initialized():  # say so, do not hang
        raise SystemExit("harness.fork_agent: CUDA was initialized while importing the ranks' "
                         "modules; forked ranks could not use it (use --rank-start fresh)")


def fresh_signals() -> None:
    """A fresh Python's signal handling in a forked process (not its parent's handlers)."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def rank_main(*cmd_args: str) -> int:
    """The forked rank: ``cmd_args`` are what torchrun would have run after ``python``
    (``-u -m harness.worker --plan PLAN``)."""
    i = cmd_args.index("-m")
    if cmd_args[i + 1] != "harness.worker":
        raise SystemExit(f"fork_agent runs harness.worker only, not {cmd_args[i + 1]}")
    from harness.worker import main as worker
    # not the agent's (torchrun's SIGTERM handler raises an exception, which a rank waiting
    # inside a collective would only see once it returns)
    fresh_signals()
    worker._T_MAIN = time.time()  # the rank's process is up (its imports are the agent's)
    sys.argv = [worker.__file__, *cmd_args[i + 2:]]  # what a fresh rank's sys.argv would hold
    # returned to torchrun, which waits for every rank's return value
    return worker.main(list(cmd_args[i + 2:]), hard_exit=False)


EXIT_LINE = "harness.fork_agent: process {pid} exitcode: {code}"


def _watch_exits(stop, period_s: float = 0.02) -> None:
    """Print every rank that ends with a non-zero status as it ends (``EXIT_LINE``).

    torchrun's failure summary names each failed rank of fresh-Python ranks, but of forked ones
    only the first that failed: a rank SIGKILLed mid-save was reported as its peer's "exit code
    1" (the peer's collective failed first). The launcher maps the pid to its rank through the
    ranks' progress files (harness/launch_dir.py ``rank_exits``)."""
    import multiprocessing
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
    """torchrun's ``elastic_launch`` with our function entry point, forked."""
    config.start_method = "fork"
    return elastic_launch(config=config, entrypoint=rank_main)


def main(argv: list[str]) -> None:
    # torch.cuda.is_available() (which torch and the harness call here and there) asks the CUDA
    # runtime by default, and a forked child cannot use CUDA after that ("Cannot re-initialize
    # CUDA in forked subprocess"); NVML answers without touching CUDA
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch.distributed.run as torchrun
    preload()
    args = torchrun.parse_args(argv)
    # torchrun's own run() (standalone rendezvous, config from the arguments) with the entry
    # point swapped: it calls elastic_launch(config=..., entrypoint=python)(*["-u", "-m", ...])
    torchrun.elastic_launch = functools.partial(_forking_launch, torchrun.elastic_launch)
    stop = threading.Event()
    threading.Thread(target=_watch_exits, args=(stop,), daemon=True).start()
    try:
        torchrun.run(args)  # raises when a rank failed: Python reports it and exits 1
    finally:
        stop.set()
    # every rank ended well and torchrun is done: skip the teardown of the modules imported
    # above (measured 0.4-0.6 s per launch on 2 cores)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
