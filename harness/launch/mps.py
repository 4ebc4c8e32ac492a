"""A CUDA MPS server of the run's own, for the ranks that share a GPU over gloo.

Without it every rank is a CUDA context of its own and the GPU time-slices between dozens of
them; under MPS their kernels go through one server and run side by side. The run starts a
private control daemon (``nvidia-cuda-mps-control -d``) with pipe and log directories of its
own (``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY`` in a marked temporary directory,
``launch/scratch.py``) and hands that environment to its launches. Who is a client: the ranks
that share a GPU over gloo. Not: NCCL ranks (a GPU of their own) and what a rank starts, DCP's
process-based stagers among them (``worker/mps_client.py``: with them the clients outnumbered
the server's limit and every async_process save failed, "CUDA-capable device(s) is/are busy
or unavailable").

Under MPS a fatal GPU fault of one client (an illegal address in a kernel) faults every client
on that GPU: the other launches sharing it crash too and their cases fail with the crash --
loudly, never a pass; ``--accelerations all,-mps`` gives each rank a context of its own.

The run asks the daemon to quit when it ends; processes of the daemon still there after a
bounded wait are killed (found by their environment's pipe directory), and a later run does
the same for a killed run's daemon (:func:`sweep`). Where it cannot apply -- no
``nvidia-cuda-mps-control``, a GPU whose compute mode is not Default, the caller's own MPS
(their ``CUDA_MPS_PIPE_DIRECTORY``: used as it is), more ranks a GPU at once than MPS takes
(:func:`too_many`, once the run's lanes are known) -- the run goes without and its meta says
why.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from harness.launch import scratch

CONTROL = "nvidia-cuda-mps-control"
PIPE_VAR, LOG_VAR = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"
MAX_CLIENTS = 48  # MPS's client contexts per GPU (Volta and later)
STEP_S = 10.0  # the longest the daemon's start, its quit and the kill of what is left may take
COMM = CONTROL[:15]  # the kernel's name of its processes (control and server): 15 characters


class Server:
    """A running private MPS daemon: ``env()`` for the launches, ``stop()`` when the run ends."""

    def __init__(self, root: Path, control: str):
        self.root, self.control = Path(root), control
        self.pipe, self.log = self.root / "pipe", self.root / "log"

    def env(self) -> dict:
        return {PIPE_VAR: str(self.pipe), LOG_VAR: str(self.log)}

    def describe(self) -> str:
        return f"a server of the run's own ({self.pipe})"

    def stop(self) -> str:
        """Quit the daemon, kill what is left of it, remove its directory; '' or what was
        killed. Bounded (about 3 x ``STEP_S``); idempotent."""
        return stop_dir(self.root, self.control)


def why_not(env, control: str | None, modes: list[str] | None) -> str | None:
    """Why a run cannot have a server of its own, else None."""
    if env.get(PIPE_VAR):
        return f"the caller's own MPS ({PIPE_VAR}={env[PIPE_VAR]})"
    if not control:
        return f"no {CONTROL} on the PATH"
    if modes is None:
        return "nvidia-smi cannot tell the GPUs' compute mode"
    if any(m != "Default" for m in modes):
        return f"a GPU's compute mode is not Default ({', '.join(modes)})"
    return None


def too_many(ranks: int, gpus: int) -> str | None:
    """Why ``ranks`` rank processes at once on ``gpus`` GPUs (the run's lanes, spread over
    them) cannot all be MPS clients, else None."""
    per_gpu = math.ceil(ranks / max(1, gpus))
    if per_gpu > MAX_CLIENTS:
        return f"up to {per_gpu} ranks a GPU at once, more than MPS's {MAX_CLIENTS} clients"
    return None


def compute_modes(smi: str | None = None) -> list[str] | None:
    smi = smi or shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=compute_mode", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=STEP_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    modes = [m.strip() for m in out.stdout.splitlines() if m.strip()]
    return modes if out.returncode == 0 and modes else None


def start(env, *, control: str | None = None, modes: list[str] | None | bool = False,
          tmp: str = "/tmp") -> tuple[Server | None, str]:
    """Start the run's daemon where it can apply: (the server, how the run's meta describes it)
    or (None, why not). ``modes``: the GPUs' compute modes (False: ask nvidia-smi)."""
    control = control or shutil.which(CONTROL, path=env.get("PATH"))
    modes = compute_modes() if modes is False else modes
    why = why_not(env, control, modes)
    if why:
        return None, f"off: {why}"
    # short: the daemon's sockets live in the pipe directory (a socket path takes 107 bytes)
    server = Server(Path(tempfile.mkdtemp(prefix=scratch.prefix("mps"), dir=tmp)), control)
    server.pipe.mkdir()
    server.log.mkdir()
    out = server.log / "start.out"  # a file, not a pipe: the daemon may keep what it inherits
    # the server sees every GPU: the launches' CUDA_VISIBLE_DEVICES name the host's numbers,
    # which a server started under the caller's CUDA_VISIBLE_DEVICES would renumber from 0
    daemon_env = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
    try:
        with open(out, "w") as f:
            rc = subprocess.run([control, "-d"], env={**daemon_env, **server.env()},
                                stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                timeout=STEP_S).returncode
        failed = rc != 0 and f"{CONTROL} -d exited {rc}: {out.read_text().strip()[-300:]}"
        deadline = time.monotonic() + STEP_S
        while not failed and not (server.pipe / "control").exists():
            if time.monotonic() > deadline:
                failed = f"{CONTROL} made no control pipe in {STEP_S:g} s"
            time.sleep(0.05)
    except (OSError, subprocess.TimeoutExpired) as e:
        failed = f"{CONTROL} -d: {e}"
    except BaseException:  # Ctrl-C / SIGTERM while it starts: nothing of it stays
        server.stop()
        raise
    if failed:
        server.stop()
        return None, f"off: {failed}"
    return server, server.describe()


def holders(pipe: Path) -> list[int]:
    """This user's MPS processes (control daemon, server) serving ``pipe``."""
    needle, out, uid = f"{PIPE_VAR}={pipe}".encode(), [], os.getuid()
    for p in Path("/proc").glob("[0-9]*"):
        try:
            if p.stat().st_uid != uid or (p / "comm").read_text().strip() != COMM:
                continue
            if needle in (p / "environ").read_bytes().split(b"\0"):
                out.append(int(p.name))
        except (OSError, ValueError):
            continue
    return sorted(out)


def stop_dir(root: Path, control: str | None = None) -> str:
    """Stop the daemon whose pipe directory is ``root/pipe``: ``quit``, a bounded wait, SIGKILL
    for what is left; then remove ``root``. '' or "killed MPS pids ..."."""
    root = Path(root)
    pipe, killed = root / "pipe", []
    control = control or shutil.which(CONTROL)
    if control and (pipe / "control").exists():
        try:
            subprocess.run([control], input="quit\n", text=True, capture_output=True,
                           env={**os.environ, PIPE_VAR: str(pipe), LOG_VAR: str(root / "log")},
                           timeout=STEP_S)
        except (OSError, subprocess.TimeoutExpired):
            pass
    deadline = time.monotonic() + STEP_S
    while (left := holders(pipe)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    shutil.rmtree(root, ignore_errors=True)
    return f"killed MPS pids {', '.join(map(str, killed))} after quit" if killed else ""


def sweep(dirs: list[Path]) -> int:
    """Stop the daemons of killed runs (their marked ``harness-mps-*`` directories in
    ``dirs``, ``scratch.leftovers``); how many. Their directories go with them."""
    dead = [p for p in scratch.leftovers(dirs) if p.name.startswith("harness-mps-")]
    for p in dead:
        stop_dir(p)
    return len(dead)
