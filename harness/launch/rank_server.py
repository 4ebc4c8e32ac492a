"""The run's rank server: one process that has imported what every rank imports (torch,
dynamo / Inductor, DCP, FSDP2, the worker's modules, the library under test) and forks each
launch's torchrun agent, whose ranks fork from the agent in turn -- no rank and no agent imports
anything at start.

In a fresh Python every rank imports those modules itself: CPU-seconds a rank, with dozens of
ranks sharing the host's cores, and each launch waits for its ranks' imports before its first
task. The server is Python's ``multiprocessing`` forkserver with a preload
(``fork_agent.preload``): the plugin starts it while pytest collects, so its imports overlap the
collection; each launch asks it for an agent (``start_agent``: a ``ForkedAgent``, what
``subprocess.Popen`` is to a fresh agent).

Forking is safe only before CUDA is initialized: the server's imports run with NVML's CUDA
check and are checked not to have touched the driver; where they did (or failed), each agent
runs torchrun with fresh ranks instead and says so in its log. A server that is gone, or forks
no agent within the launch's start-up bound, is killed; its launches' agents then start fresh
(said once on stderr and in each launch's log). After the imports the server
freezes the garbage collector's objects (``gc.freeze``): a forked rank's collections neither walk
nor copy them. Lifetime: the server is tethered to this process (``PR_SET_PDEATHSIG``), which
holds the only write end of the server's alive pipe (each agent closes the one it inherits: the
server exits when this process does), each agent is tethered to the server, each rank to its
agent; :meth:`RankServer.stop` ends it. One server per process (the forkserver is
``multiprocessing``'s, one per process).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness.launch import fork_agent, procs, scratch
from harness.launch.launch import TORCHRUN, popen_agent, scratch_parent
from harness.worker import stager_fork

PRELOAD = "harness.launch.server_preload"  # imported by the server: its import is the preload
STOP_WAIT_S = 10.0
# torch.cuda.is_available() / device_count() from NVML: the CUDA runtime's answer would make
# every process forked after it unable to use CUDA (torch's fork poisoning), in the server and
# in each agent before it forks its ranks
NVML_VAR = "PYTORCH_NVML_BASED_CUDA_CHECK"


@contextlib.contextmanager
def _environment(env: dict):
    """``os.environ`` is ``env`` while the block runs (the forkserver is spawned with it)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class ForkedAgent:
    """A torchrun agent forked by the server, with the part of ``subprocess.Popen``'s interface
    a launch uses (``pid``, ``poll``, ``wait``, ``returncode``: negative for a signal)."""

    def __init__(self, process):
        self.process, self.pid = process, process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(f"agent {self.pid}", timeout)
        return self.process.exitcode


class RankServer:
    """The forkserver of one run (one library, one base environment)."""

    def __init__(self, backend: str, env: dict):
        self.backend, self.env = backend, dict(env)
        self.ctx = multiprocessing.get_context("forkserver")
        self.started = False
        self.dir: str | None = None  # its socket's directory
        self.pid: int | None = None
        self.address: str | None = None  # its socket
        self._own_tracker = False
        self.broken: str | None = None  # why agents start fresh (the server failed)
        self.told = False  # ... said once on stderr
        self.agents = 0  # agents asked of it: none, and close() need not wait for its imports

    def start(self) -> "RankServer":
        """Spawn the server (it preloads in the background; the first agent waits for it)."""
        from multiprocessing import forkserver
        self.ctx.set_forkserver_preload([PRELOAD])
        env = {**self.env, fork_agent.BACKEND_VAR: self.backend,
               fork_agent.PARENT_VAR: str(os.getpid()), NVML_VAR: "1"}
        # its socket goes in a directory of ours (pytest's TMPDIR: removed by stop(), or by the
        # next run's sweep where pytest was killed), not in multiprocessing's pymp-* there
        self.dir = tempfile.mkdtemp(prefix=scratch.prefix("rank-server"),
                                    dir=scratch_parent())
        from multiprocessing import resource_tracker
        tracker = resource_tracker._resource_tracker
        self._own_tracker = tracker._pid is None  # the forkserver starts it: stop() ends it
        config = multiprocessing.process.current_process()._config
        before = config.get("tempdir")
        config["tempdir"] = self.dir
        try:
            with _environment(env):
                forkserver.ensure_running()
        finally:
            if before is None:
                config.pop("tempdir", None)
            else:
                config["tempdir"] = before
        self.started, self.pid = True, forkserver._forkserver._forkserver_pid
        self.address = forkserver._forkserver._forkserver_address  # ranks' stagers fork here too
        return self

    def start_agent(self, argv: list[str], env: dict, log: Path, cwd: Path, timeout_s: float):
        """A launch's torchrun agent (``argv``: the fresh agent's command line) forked from the
        server, in a session of its own, with ``env`` as its environment and its output in
        ``log``. Bounded: a server that is gone, or forks no agent within ``timeout_s`` (its
        imports hang), is killed and marked broken, and this and every later agent start
        fresh (``launch.popen_agent``), with the reason in the log."""
        if self.broken is None and not _alive(self.pid):
            self.broken = "the rank server exited"
        if self.broken is None:
            self.agents += 1
            p = self.ctx.Process(target=fork_agent.agent_main, name="torchrun-agent", args=(
                argv[argv.index(TORCHRUN) + 1:],
                {**env, NVML_VAR: "1", stager_fork.SERVER_VAR: self.address}, str(log), str(cwd)))
            errors: list[Exception] = []

            def start():  # waits until the server's imports are done
                try:
                    p.start()
                except Exception as e:  # noqa: BLE001 - the server is gone: fresh agents
                    errors.append(e)
            started = threading.Thread(target=start, daemon=True)
            started.start()
            started.join(timeout_s)
            if p.pid is not None and not started.is_alive():
                return ForkedAgent(p)
            self.broken = f"the rank server could not fork an agent ({errors[0]!r})" if errors \
                else f"the rank server forked no agent within {timeout_s:g} s"
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)  # (the blocked start then fails: EOF)
        if not self.told:
            self.told = True
            print(f"harness: {self.broken}; launches start fresh agents and ranks",
                  file=sys.stderr, flush=True)
        with open(log, "a") as out:
            out.write(fork_agent.FRESH_LINE.format(why=self.broken) + "\n")
            out.flush()
            return popen_agent(argv, env, out, cwd)

    def close(self) -> None:
        """No launch will ask for an agent any more: the server may end now -- our end of its
        alive pipe is closed and it exits at EOF while the run writes its results (its exit then
        overlaps that work instead of adding to pytest's end); :meth:`stop` reaps it."""
        if not self.started:
            return
        from multiprocessing import forkserver
        server = forkserver._forkserver
        with server._lock:
            fd, server._forkserver_alive_fd = server._forkserver_alive_fd, None
        self.broken = self.broken or "the rank server was closed"
        if fd is not None:
            os.close(fd)
        if not self.agents and _alive(self.pid):  # unused (no case ran): its imports may stop
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)

    def stop(self) -> None:
        """End the server (its agents, tethered to it, end with it): :meth:`close` (if not
        done yet), then reap it, SIGKILLed after ``STOP_WAIT_S``; the same for
        ``multiprocessing``'s resource tracker where the server's start started it.
        (``multiprocessing`` keeps this state in private attributes; its own ``_stop``
        methods wait without a bound.)"""
        if not self.started:
            return
        self.close()
        self.started = False
        from multiprocessing import forkserver, util
        server = forkserver._forkserver
        with server._lock:
            pid, address = server._forkserver_pid, server._forkserver_address
            server._forkserver_pid = server._forkserver_address = None
        _end(None, pid)  # (close() closed our end of its pipe)
        if address and not util.is_abstract_socket_namespace(address):
            with contextlib.suppress(OSError):
                os.unlink(address)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self._own_tracker:  # multiprocessing's resource tracker, started with the server
            from multiprocessing import resource_tracker
            tracker = resource_tracker._resource_tracker
            with tracker._lock:
                fd, pid = tracker._fd, tracker._pid
                tracker._fd = tracker._pid = None
            _end(fd, pid)


def _alive(pid: int | None) -> bool:
    return pid is not None and procs.alive(pid)


def _end(fd: int | None, pid: int | None) -> None:
    """Close our end ``fd`` of a helper's pipe (it exits at EOF), then reap it (bounded)."""
    if fd is not None:
        os.close(fd)
    if pid is not None:
        _reap(pid, STOP_WAIT_S)


def _reap(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        time.sleep(0.02)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)  # SIGKILLed: reaped at once


def available() -> bool:
    """Forking servers need Linux (the tethers) and the forkserver start method."""
    return sys.platform.startswith("linux") and \
        "forkserver" in multiprocessing.get_all_start_methods()
