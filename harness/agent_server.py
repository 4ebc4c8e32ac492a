"""``python -m harness.agent_server SOCKET IDLE_S``: one process with torch, DCP and the worker's
modules imported that forks the torchrun agent of every CPU launch.

A launch with forked ranks (harness/fork_agent.py) still started its agent as a fresh Python
that imported those modules first: ~3 CPU-seconds a launch on a 2-core VM, 37 launches in the
harness's own tests. The launcher now asks this server instead (:class:`Servers`): it forks,
and the child becomes exactly what ``python -m harness.tethered --parent P harness.fork_agent
ARGS`` would have been -- a session of its own, the launch's environment, working directory and
log as stdout / stderr, tethered (``PR_SET_PDEATHSIG``) to the server, which is tethered to the
launcher's process -- and runs ``fork_agent.main(ARGS)``. The launcher gets an
:class:`AgentProc` that acts like the ``subprocess.Popen`` it replaces (pid, poll, wait,
returncode): the server reaps its children and sends each exit status back on the request's
connection.

A server serves only launches whose environment, apart from what differs per launch
(:data:`PER_LAUNCH`), is the one it was started with (the modules it imported saw that
environment); any other launch, a server that cannot start, or a request that fails starts
its agent as before. A server with no agent left and no request for ``IDLE_S`` exits; the
launcher ends its servers when a run ends (``Servers.close``). Every process the server forks
shows the server's tag in ``/proc/PID/environ`` (a forked child keeps its parent's initial
environment there), so ``procs.kill_tagged`` still finds them all.

Linux only (``SOCK_SEQPACKET``, ``send_fds``, prctl); elsewhere launches start as before.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

from . import procs

IDLE_S = 20.0  # a server with no agent and no request for this long exits
READY_S = 60.0  # bounded wait for a new server's socket (its imports take seconds)
PER_LAUNCH = (procs.TAG_VAR, procs.PARENT_VAR, "TMPDIR", "TEMP", "TMP", "CUDA_VISIBLE_DEVICES")
AGENT = "harness.fork_agent"
MAX_MSG = 1 << 20


def env_key(env: dict) -> str:
    """What a server and a launch must agree on: the environment minus :data:`PER_LAUNCH`."""
    return json.dumps({k: v for k, v in env.items() if k not in PER_LAUNCH}, sort_keys=True)


def agent_args(argv: list[str], python: str) -> list[str] | None:
    """The fork agent's own arguments when ``argv`` is the launcher's
    ``python -m harness.tethered --parent <this pid> harness.fork_agent ARGS``, else None."""
    head = [python, "-m", "harness.tethered", "--parent", str(os.getpid()), AGENT]
    return argv[len(head):] if argv[:len(head)] == head else None


# --- the launcher's side ------------------------------------------------------------------
class AgentProc:
    """A forked agent, as the launcher sees a ``subprocess.Popen``: ``pid``, ``poll()``,
    ``wait(timeout)``, ``returncode`` (negative: the signal that ended it)."""

    def __init__(self, conn: socket.socket, pid: int, args: list[str]):
        self.conn, self.pid, self.args, self.returncode = conn, pid, args, None

    def poll(self) -> int | None:
        return self._read(0.0)

    def wait(self, timeout: float | None = None) -> int:
        if self._read(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _read(self, timeout: float | None) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if select.select([self.conn], [], [], timeout)[0]:
            try:
                msg = self.conn.recv(MAX_MSG)
            except OSError:
                msg = b""
            # the server died (its agents died with it: tethered) or sent the exit status
            self.returncode = json.loads(msg)["returncode"] if msg else -signal.SIGKILL
            self.conn.close()
        return self.returncode


class Server:
    """One server process, started (and owned) by a thread of its own: ``PR_SET_PDEATHSIG``
    fires when the *thread* that started a process ends, and a lane's thread ends long before
    the server should."""

    def __init__(self, python: str, env: dict, log_dir: str):
        self.tmp = tempfile.mkdtemp(prefix="harness-agents-", dir=log_dir)
        self.path = os.path.join(self.tmp, "s")
        self.tag = procs.new_tag("agents")
        self.env = {**env, procs.TAG_VAR: self.tag, "TMPDIR": self.tmp}
        self.argv = [python, "-m", "harness.tethered", "--parent", str(os.getpid()),
                     "harness.agent_server", self.path, str(IDLE_S)]
        self.proc: subprocess.Popen | None = None
        self._started, self._stop = threading.Event(), threading.Event()
        threading.Thread(target=self._own, daemon=True, name="agent-server").start()
        self._started.wait()

    def _own(self) -> None:
        try:
            with open(os.path.join(self.tmp, "server.log"), "w") as log:
                self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True, cwd=self.tmp)
        finally:
            self._started.set()
        while self.proc is not None and not self._stop.wait(0.5) and self.proc.poll() is None:
            pass

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self, args: list[str], env: dict, cwd: str, out) -> AgentProc | None:
        """Ask the server to fork an agent; None when it cannot (the caller starts one)."""
        deadline = time.monotonic() + READY_S
        while self.alive() and not os.path.exists(self.path) and time.monotonic() < deadline:
            time.sleep(0.02)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.settimeout(READY_S)
            conn.connect(self.path)
            req = json.dumps(dict(args=args, env=env, cwd=cwd)).encode()
            socket.send_fds(conn, [req], [out.fileno()])
            reply = conn.recv(MAX_MSG)
            pid = json.loads(reply)["pid"]
        except (OSError, ValueError, KeyError):
            conn.close()
            return None
        return AgentProc(conn, pid, [AGENT, *args])

    def close(self) -> None:
        """End the server and every process it forked that is still alive (bounded)."""
        self._stop.set()
        # by pid too: a dying process's /proc environ reads empty before it is gone
        forked = [self.proc.pid, *procs.descendants([self.proc.pid])] if self.proc else []
        procs.kill_tagged(self.tag, forked, timeout_s=15)
        if self.proc is not None:
            procs.reap(self.proc)
        shutil.rmtree(self.tmp, ignore_errors=True)


class Servers:
    """The launcher's agent servers, one per launch environment (:func:`env_key`)."""

    def __init__(self, python: str, scratch: str):
        self.python, self.scratch = python, scratch  # scratch: where its sockets go
        self._lock, self.by_key = threading.Lock(), {}

    def start_agent(self, argv: list[str], env: dict, cwd: str, out) -> AgentProc | None:
        """The agent of ``argv`` forked by a server, or None (start it as before)."""
        args = agent_args(argv, self.python)
        if args is None or not sys.platform.startswith("linux"):
            return None
        key = env_key(env)
        for _ in range(2):  # a server that just exited idle is replaced once
            with self._lock:
                server = self.by_key.get(key)
                if server is None or not server.alive():
                    if server is not None:
                        server.close()
                    server = self.by_key[key] = Server(self.python, env, self.scratch)
            agent = server.spawn(args, env, cwd, out)
            if agent is not None or server.alive():
                return agent
        return None

    def close(self) -> None:
        with self._lock:
            servers, self.by_key = list(self.by_key.values()), {}
        for s in servers:
            s.close()


# --- the server ---------------------------------------------------------------------------
def serve(path: str, idle_s: float) -> None:
    from . import fork_agent
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # as fork_agent.main does
    importlib.import_module("torch.distributed.run")  # what the agent runs
    fork_agent.preload()
    procs.set_name("harness-agents")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)  # the path appears once it accepts
    children: dict[int, socket.socket] = {}
    dropped: set[int] = set()
    idle_since = time.monotonic()
    while children or time.monotonic() - idle_since < idle_s:
        ready = select.select([listener, *children.values()], [], [], 0.05)[0]
        for s in ready:
            if s is listener:
                conn = listener.accept()[0]
                pid = _fork(conn, listener, children)
                if pid is not None:
                    children[pid] = conn
            else:  # the launcher dropped an agent it started: it ends too (reaped below)
                pid = next(p for p, c in children.items() if c is s)
                if pid not in dropped:
                    dropped.add(pid)
                    procs.kill_group(pid)
        for pid, code in _reaped(list(children)):
            conn = children.pop(pid)
            try:
                conn.send(json.dumps(dict(returncode=code)).encode())
            except OSError:
                pass
            conn.close()
        if children:
            idle_since = time.monotonic()
    listener.close()
    os.unlink(path)


def _reaped(pids: list[int]) -> list[tuple[int, int]]:
    out = []
    for pid in pids:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done:
            out.append((pid, os.waitstatus_to_exitcode(status)))
    return out


def _fork(conn: socket.socket, listener, children) -> int | None:
    try:
        msg, fds, _, _ = socket.recv_fds(conn, MAX_MSG, 1)
        req = json.loads(msg)
    except (OSError, ValueError):
        conn.close()
        return None
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        for s in (listener, conn, *children.values()):
            s.close()
        _agent(req, fds[0], server)  # never returns
    os.close(fds[0])
    try:
        conn.send(json.dumps(dict(pid=pid)).encode())
    except OSError:
        procs.kill_group(pid)
    return pid


def _agent(req: dict, out_fd: int, server: int) -> None:
    """The forked child: what ``python -m harness.tethered --parent <server>
    harness.fork_agent ARGS`` would be, then ``fork_agent.main(ARGS)``."""
    code = 1
    try:
        os.setsid()
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        from . import fork_agent
        fork_agent.fresh_signals()
        procs.tether(server)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        os.environ[procs.PARENT_VAR] = str(os.getpid())
        tempfile.tempdir = None  # the launch's TMPDIR, not the server's
        sys.path[0] = req["cwd"]  # as ``python -m`` started there would have it
        sys.argv = [AGENT, *req["args"]]
        procs.set_name("harness-agent")
        fork_agent.main(req["args"])  # ends the process itself after a clean run
        code = 0
    except SystemExit as e:  # as Python's own exit: None is 0, an int itself, else printed, 1
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    serve(sys.argv[1], float(sys.argv[2]))
