"""A rank's connect to torchrun's store that gets no answer is given up after ``CONNECT_S`` and
tried again on a new socket (harness/worker/store.py), instead of waiting the whole set-up
timeout."""

import socket
import threading
from datetime import timedelta

import torch.distributed as dist

from harness.worker import store


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        dst.close()


def _proxy_that_swallows_the_first_connection(target_port: int):
    """A listener in front of the store: its first connection is accepted and never answered
    (what a lost connect looks like to the client), later ones are passed through."""
    listener = socket.create_server(("127.0.0.1", 0))
    swallowed: list[socket.socket] = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            if not swallowed:
                swallowed.append(conn)
                continue
            up = socket.create_connection(("127.0.0.1", target_port))
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener, swallowed


def test_an_unanswered_connect_is_tried_again_on_a_new_socket(monkeypatch, capfd):
    server = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    listener, swallowed = _proxy_that_swallows_the_first_connection(server.port)
    try:
        monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(listener.getsockname()[1]))
        monkeypatch.setattr(store, "CONNECT_S", 1.0)
        client = store.agent_store(1, timedelta(seconds=60))
        client.set("k", "v")
        assert server.get("default_pg/k") == b"v"  # init_process_group's env:// prefix
        assert len(swallowed) == 1
        assert "connect 1 to the store at 127.0.0.1:" in capfd.readouterr().err
        assert client.timeout == timedelta(seconds=60)  # what follows: the set-up timeout
    finally:
        listener.close()
        for s in swallowed:
            s.close()


def test_without_torchruns_agent_store_the_rendezvous_is_torchs_own(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert store.agent_store(2, timedelta(seconds=60)) is None
