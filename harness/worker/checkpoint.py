"""DCP save / load of a Run's model + optimizer, sync or async (thread / process staging)."""

from __future__ import annotations

import io
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from .run import flatten

ASYNC_TYPES = {"async_thread": AsyncCheckpointerType.THREAD,
               "async_process": AsyncCheckpointerType.PROCESS}


def app_state(run) -> dict:
    msd, osd = get_state_dict(run.model, run.optim)
    return {"model": msd, "optim": osd}


def save(run, path: Path, mode: str, async_group=None):
    """Start a save; returns a handle for ``wait`` (None for sync saves, which are done).

    Async saves coordinate over ``async_group``, a gloo group of their own: their planning
    collectives run in the background while training uses the default group, and two threads
    issuing collectives on one group deadlock (torchtitan does the same).
    """
    state = app_state(run)
    if mode == "sync":
        dcp.save(state, checkpoint_id=str(path))
        return None
    if mode == "async_process":
        from . import stager
        stager.wait(timeout_s=run.case.timeout_s)
    return dcp.async_save(state, checkpoint_id=str(path), process_group=async_group,
                          async_checkpointer_type=ASYNC_TYPES[mode])


def wait(handle, timeout_s: float) -> None:
    """Block until an async save is written (bounded). Raises on the save's error."""
    if handle is None:
        return
    fut = getattr(handle, "upload_completion", handle)  # AsyncSaveResponse or Future
    fut.result(timeout=timeout_s)


def load(run, path: Path) -> None:
    state = app_state(run)
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(run.model, run.optim, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])


def read_full(path: Path) -> dict:
    """What a checkpoint holds on disk, assembled to full tensors and flattened like
    ``Run.full_state`` (quantized tensors as raw parts). Reads the DCP files directly, chunk by
    chunk (rank-local, no collectives), with ``torch.load(weights_only=True)`` as DCP does."""
    reader = FileSystemReader(str(path))
    md = reader.read_metadata()
    chunks: dict[str, list] = {}
    for index, info in md.storage_data.items():
        with open(Path(path) / info.relative_path, "rb") as f:
            f.seek(info.offset)
            obj = torch.load(io.BytesIO(f.read(info.length)), weights_only=True)
        chunks.setdefault(index.fqn, []).append((tuple(index.offset or ()), obj))
    state = {}
    for fqn, meta in md.state_dict_metadata.items():
        got = sorted(chunks.get(fqn, []), key=lambda c: c[0])
        if isinstance(meta, BytesStorageMetadata):
            state[fqn] = got[0][1]
        elif got and hasattr(got[0][1], "full_parts"):
            for k, v in type(got[0][1]).assemble(got, tuple(meta.size)).items():
                state[f"{fqn}#{k}"] = v
            state[f"{fqn}#codec"] = got[0][1]._codec.name
        else:  # plain tensors; other quantized subclasses (TE) compare as values
            full = torch.zeros(meta.size, dtype=meta.properties.dtype)
            for offsets, t in got:
                if type(t) is not torch.Tensor and hasattr(t, "dequantize"):
                    t = t.dequantize()
                full[tuple(slice(o, o + n) for o, n in zip(offsets, t.shape))] = t
            state[f"{fqn}#dequantized" if _te_like(got) else fqn] = full
    return flatten(state)


def _te_like(chunks) -> bool:
    return any(type(t) is not torch.Tensor and hasattr(t, "get_metadata") for _, t in chunks)


def is_complete(path: Path) -> bool:
    """DCP writes .metadata last: a checkpoint without it is not finished."""
    return (Path(path) / ".metadata").is_file()

