"""The rank's client of torchrun's store, each connect attempt bounded and tried again on a
new socket.

torchrun's agent hosts the store (``TORCHELASTIC_USE_AGENT_STORE``) and ``init_process_group``'s
``env://`` rendezvous connects to it once. On the 2-core sandboxed VM (Firecracker) a loopback
connect now and then gets no answer: 38 of 1000 TCPStore connects in a loop took 5.0 s (raw
sockets: 5 of 1000 took 1.0 s), and in one smoke run a world-4 launch waited its whole 60 s
set-up timeout for one rank that never got past ``TCPStore(...)``, then ran again. TCPStore's
constructor waits for an unanswered connection without bound (a listener that accepts and
never answers holds it far past its timeout) but releases the GIL: so each attempt runs in a
thread of its own, is given up after ``CONNECT_S`` (a connect, validation and ping take
milliseconds when the store answers) and left blocked, and the next one starts on a new
socket, until the set-up timeout is spent.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from datetime import timedelta

CONNECT_S = 3.0  # one attempt: connect + the store's validation and ping round trips


def agent_store(world_size: int, setup: timedelta):
    """``PrefixStore("default_pg", client)`` as the ``env://`` rendezvous makes it, with the
    set-up timeout for what follows; None where the agent does not host the store (then
    ``init_process_group`` rendezvouses itself)."""
    import torch.distributed as dist

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return None
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    deadline = time.monotonic() + setup.total_seconds()
    for attempt in itertools.count(1):
        left = deadline - time.monotonic()
        store, why = _attempt(host, port, world_size, max(0.1, min(CONNECT_S, left)))
        if store is not None:
            store.set_timeout(setup)
            return dist.PrefixStore("default_pg", store)
        if left <= CONNECT_S:
            raise RuntimeError(f"harness: no connection to the store at {host}:{port} within "
                               f"{setup.total_seconds():.0f}s ({attempt} attempts): {why}")
        print(f"harness: connect {attempt} to the store at {host}:{port} failed, trying again: "
              f"{why}", file=sys.stderr, flush=True)


def _attempt(host: str, port: int, world_size: int, timeout_s: float):
    """(a TCPStore client, "") or (None, why) within ``timeout_s`` (+ a little)."""
    import torch.distributed as dist
    out: dict = {}

    def connect():
        try:
            out["store"] = dist.TCPStore(host, port, world_size, is_master=False,
                                         timeout=timedelta(seconds=timeout_s))
        except RuntimeError as e:  # DistStoreError / DistNetworkError
            out["error"] = str(e).splitlines()[0] if str(e) else type(e).__name__

    th = threading.Thread(target=connect, daemon=True, name="store-connect")
    th.start()
    th.join(timeout_s + 0.5)
    if "store" in out:
        return out["store"], ""
    return None, out.get("error", f"no answer within {timeout_s:.0f}s")
