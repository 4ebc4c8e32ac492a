"""Which processes of a rank are clients of the run's own MPS server (``launch/mps.py``): a
rank that shares its GPU over gloo is; an NCCL rank (a GPU of its own) is not, nor is anything
a rank starts -- DCP's stagers (with them the clients outnumbered the server's limit and every
async_process save failed), compile workers. CUDA decides when a process's driver starts, from
its environment: a client leaves the server's pipe directory out of its environment once its
own CUDA context is up, so the processes it starts later go without."""

from __future__ import annotations

import os

PIPE_VAR = "CUDA_MPS_PIPE_DIRECTORY"  # CUDA's: where a client finds its MPS server
MARK = "/harness-mps-"  # the run's own server's directory (launch/mps.py); a caller's stays


def leave(env: dict) -> dict:
    """``env`` (changed in place) without the run's own MPS server."""
    if MARK in env.get(PIPE_VAR, ""):
        del env[PIPE_VAR]
    return env


def start_cuda(device, shared: bool) -> None:
    """This rank's CUDA context on ``device``: through the run's MPS server where the rank
    shares its GPU (``shared``), else without it; what the rank starts afterwards goes without
    either way."""
    import torch
    if not shared:
        leave(os.environ)
    torch.cuda.set_device(device)
    torch.zeros(1, device=device)  # the context, and its connection to the server, exist now
    leave(os.environ)
