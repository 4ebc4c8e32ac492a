"""DCP save / load of a Run's model + optimizer, sync or async (thread / process staging).

Every failure names the checkpoint: a save that fails raises :class:`CheckpointSaveError`
("DCP save to <path> failed: ..."), an async save that does not finish in time or whose
process-based stager died says so, and nothing is loaded or read from a checkpoint that
:func:`verify` finds broken (no ``.metadata``, a shard file missing or shorter than the
metadata says): :class:`CheckpointBroken` names the file and the sizes.
"""

from __future__ import annotations

import io
import time
import traceback
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from harness.distributed.run import flatten

ASYNC_TYPES = {"async_thread": AsyncCheckpointerType.THREAD,
               "async_process": AsyncCheckpointerType.PROCESS}


def app_state(run) -> dict:
    msd, osd = get_state_dict(run.model, run.optim)
    return {"model": msd, "optim": osd}


class CheckpointSaveError(RuntimeError):
    """A DCP save failed or did not finish; the message names the checkpoint."""


class CheckpointBroken(RuntimeError):
    """A checkpoint on disk is incomplete or damaged; the message names the file."""


@dataclass
class Pending:
    """An async save in flight."""
    handle: object  # AsyncSaveResponse or Future
    path: Path
    mode: str


def save(run, path: Path, mode: str, async_group=None, storage_writer=None):
    """Start a save; returns a :class:`Pending` for ``wait`` (None for sync saves, which are
    done). ``storage_writer``: DCP's default file system writer unless given (fault injection).

    Async saves coordinate over ``async_group``, a gloo group of their own: their planning
    collectives run in the background while training uses the default group, and two threads
    issuing collectives on one group deadlock (torchtitan does the same).
    """
    state = app_state(run)
    try:
        if mode == "sync":
            dcp.save(state, checkpoint_id=str(path), storage_writer=storage_writer)
            return None
        if mode == "async_process":
            from harness.distributed import stager
            stager.start(async_group)
            stager.wait(timeout_s=run.case.timeout_s)
        handle = dcp.async_save(state, checkpoint_id=str(path), process_group=async_group,
                                storage_writer=storage_writer,
                                async_checkpointer_type=ASYNC_TYPES[mode])
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise CheckpointSaveError(f"DCP {mode} save to {path} failed: {describe(e)}") from e
    return Pending(handle, Path(path), mode)


def wait(pending: Pending | None, timeout_s: float) -> None:
    """Block until an async save is written, at most ``timeout_s``. Raises
    :class:`CheckpointSaveError` naming the checkpoint on the save's error, on a timeout, and
    when this rank's process-based stager died (its exit code)."""
    if pending is None:
        return
    fut = getattr(pending.handle, "upload_completion", pending.handle)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                fut.result(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
                return
            except FutureTimeout:
                if time.monotonic() >= deadline:
                    raise CheckpointSaveError(
                        f"DCP {pending.mode} save to {pending.path} did not finish within "
                        f"{timeout_s:g} s") from None
    except CheckpointSaveError:
        _stager_failed(pending)
        raise
    except BaseException as e:
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        _stager_failed(pending)
        from harness.distributed import stager
        dead = stager.dead() if pending.mode == "async_process" else None
        why = dead or describe(e)
        raise CheckpointSaveError(f"DCP {pending.mode} save to {pending.path} failed: "
                                  f"{why}") from e


def _stager_failed(pending: Pending) -> None:
    if pending.mode == "async_process":  # the stagers' own group may be out of step now
        from harness.distributed import stager
        stager.BROKEN = True


def describe(e: BaseException) -> str:
    """One line for an exception (DCP's CheckpointException: the first rank's cause)."""
    last = traceback.format_exception_only(type(e), e)[-1].strip()
    if type(e).__name__ == "CheckpointException":
        last = f"CheckpointException on ranks {sorted(e.failures)}: {_first_cause(e)}"
    return last[:2000]


def _first_cause(e) -> str:
    """DCP wraps each rank's failure: surface the first rank's underlying error message."""
    failures = getattr(e, "failures", None) or {}
    for _, err in sorted(failures.items()):
        exc = err[0] if isinstance(err, tuple) else err
        return traceback.format_exception_only(type(exc), exc)[-1].strip()
    return ""


def load(run, path: Path) -> None:
    verify(path)
    state = app_state(run)
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(run.model, run.optim, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])


def verify(path: Path) -> None:
    """Refuse a checkpoint that cannot be complete: ``.metadata`` missing or unreadable, a
    shard file it names missing or shorter than the data it places there. Raises
    :class:`CheckpointBroken` naming the checkpoint, the file and what is wrong."""
    path = Path(path)
    if not (path / ".metadata").is_file():
        raise CheckpointBroken(f"checkpoint {path} has no .metadata (DCP writes it last: the "
                               f"save did not finish, or the file was removed); not loading it")
    try:
        md = FileSystemReader(str(path)).read_metadata()
    except Exception as e:  # noqa: BLE001 - named below
        raise CheckpointBroken(f"checkpoint {path}: .metadata cannot be read "
                               f"({describe(e)}); not loading it") from e
    needs: dict[str, int] = {}
    for info in (md.storage_data or {}).values():
        end = int(info.offset) + int(info.length)
        needs[info.relative_path] = max(needs.get(info.relative_path, 0), end)
    for name, end in sorted(needs.items()):
        f = path / name
        if not f.is_file():
            raise CheckpointBroken(f"checkpoint {path}: shard file {name} is missing "
                                   f"(.metadata places {end} bytes in it); not loading it")
        size = f.stat().st_size
        if size < end:
            raise CheckpointBroken(f"checkpoint {path}: shard file {name} holds {size} bytes, "
                                   f"but .metadata places data up to byte {end} (truncated); "
                                   f"not loading it")


def read_full(path: Path) -> dict:
    """What a checkpoint holds on disk, assembled to full tensors and flattened like
    ``Run.full_state`` (quantized tensors as raw parts). Reads the DCP files directly, chunk by
    chunk (rank-local, no collectives), with ``torch.load(weights_only=True)`` as DCP does."""
    verify(path)
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

