"""A rank's DCP stager forked from the run's rank server instead of spawned.

``dcp.async_save(..., async_checkpointer_type=PROCESS)`` runs each rank's save in a stager
process that DCP starts with ``multiprocessing``'s *spawn* method: a fresh Python that imports
torch and DCP, then the library under test while it unpickles the first state dict -- with
many ranks, a large share of a run's CPU time goes to those imports. Where the rank's launch
came from the rank server (``harness/launch/rank_server.py``, whose preload imported all of
that), the stager is forked from the server instead: the launch's environment tells the ranks
the server's socket (``SERVER_VAR``), and :func:`context` gives DCP a ``multiprocessing``
context whose processes the server forks (``multiprocessing``'s forkserver protocol, over that
socket).

A forked stager is not the rank's child: it takes the rank's environment, nice value and log,
and dies with its rank (a thread waits on the rank's pidfd) -- killing a launch's ranks ends
their stagers. Where the server cannot fork it (gone, or no socket), the caller spawns the
stager as DCP does (``distributed/stager.py``).
"""

from __future__ import annotations

import io
import multiprocessing
import os
import socket
import tempfile
from multiprocessing import context as mp_context
from multiprocessing import forkserver, popen_forkserver, reduction, resource_tracker, spawn, util

from harness.speed import layers
from harness.worker import tether

SERVER_VAR = "HARNESS_STAGER_SERVER"  # the rank server's socket (set by the launch's server)


class ServerUnavailable(OSError):
    """The server forked no stager (gone, its socket refused, no pid came back): the caller
    spawns it instead (``no_process``)."""
    no_process = True


def context(log_path: str) -> "ServerContext | None":
    """What DCP asks for its stager's ``Pipe`` and ``Process`` where a server forks them;
    None where this rank has no server (fresh launches, CPU runs without one)."""
    address = os.environ.get(SERVER_VAR)
    return ServerContext(address, log_path) if address and layers.active("stager_fork") else None


class ServerContext:
    """A ``multiprocessing`` context (the part DCP uses) whose processes the server forks."""

    def __init__(self, address: str, log_path: str):
        self.address, self.log_path = address, log_path

    def get_context(self, method=None):  # DCP: mp.get_context("spawn")
        return self

    def Pipe(self, duplex: bool = True):  # noqa: N802 - multiprocessing's name
        return multiprocessing.Pipe(duplex)

    def Process(self, *args, **kwargs):  # noqa: N802
        p = StagerProcess(*args, **kwargs)
        p.setup = dict(address=self.address, env=dict(os.environ), nice=os.nice(0),
                       rank_pid=os.getpid(), log=self.log_path,
                       name=f"harness-stager{os.environ.get('RANK', '')}",
                       no_gpu=layers.active("stager_no_gpu"))
        return p


class StagerProcess(mp_context.ForkServerProcess):
    """Started by the server's fork; in the child :meth:`run` first becomes the rank's."""
    setup: dict

    @staticmethod
    def _Popen(process_obj):  # noqa: N802 - multiprocessing's name
        return _ServerPopen(process_obj)

    def run(self):
        _become(self.setup)
        super().run()


class _ServerPopen(popen_forkserver.Popen):
    """``popen_forkserver.Popen`` with the server's address from the process's setup instead
    of this process's own forkserver (a rank never started one)."""

    def _launch(self, process_obj):
        prep_data = spawn.get_preparation_data(process_obj._name)
        buf = io.BytesIO()
        mp_context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            mp_context.set_spawning_popen(None)
        self.sentinel, w = _connect(process_obj.setup["address"], self._fds)
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))
        try:
            with open(w, "wb", closefd=True) as f:
                f.write(buf.getbuffer())
            self.pid = forkserver.read_signed(self.sentinel)
        except (OSError, EOFError) as e:  # the server went away mid-request
            raise ServerUnavailable(f"the rank server forked no stager ({e!r})") from e


def _connect(address: str, fds: list[int]) -> tuple[int, int]:
    """The forkserver protocol's request (``ForkServer.connect_to_new_process``): the child's
    pipe ends, an "alive" fd (the child would use it only to ask for processes itself: ours is
    /dev/null), the resource tracker's fd and the fds the child inherits."""
    if len(fds) + 4 >= forkserver.MAXFDS_TO_SEND:
        raise ValueError("too many fds")
    parent_r, child_w = os.pipe()
    child_r, parent_w = os.pipe()
    alive = os.open(os.devnull, os.O_RDONLY)
    try:
        with socket.socket(socket.AF_UNIX) as client:
            try:
                client.connect(address)
            except OSError as e:
                raise ServerUnavailable(f"the rank server's socket {address}: {e}") from e
            reduction.sendfds(client, [child_r, child_w, alive, resource_tracker.getfd(), *fds])
        return parent_r, parent_w
    except BaseException:
        os.close(parent_r)
        os.close(parent_w)
        raise
    finally:
        for fd in (child_r, child_w, alive):
            os.close(fd)


def _become(setup: dict) -> None:
    """In the forked stager: the rank's environment, nice value and log; tethered to the
    server (its parent) and to the rank."""
    tether.tether()
    tether.set_name(setup["name"])
    tether.die_with(setup["rank_pid"])
    adopt(setup["env"], setup["log"])
    if setup["no_gpu"]:
        # The stager writes the CPU copies DCP staged in the rank; seeing a GPU, DCP's
        # FileSystemWriter asks torch.cuda for a stream (_OverlappingCpuLoader) and so makes a
        # CUDA context per stager on its first save: seconds each under load, as the host's
        # contexts start one after another, and GPU memory held until the launch ends.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.nice(max(0, setup["nice"] - os.nice(0)))


def adopt(env: dict, log: str) -> None:
    """A process the rank server forked (a launch's agent, a rank's stager) becomes its
    launch's: ``env`` as its environment, its output appended to ``log``, and temporary files
    in that environment's TMPDIR (the server's are cached)."""
    os.environ.clear()
    os.environ.update(env)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    tempfile.tempdir = None
    multiprocessing.process.current_process()._config.pop("tempdir", None)
