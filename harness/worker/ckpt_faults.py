"""Checkpoint faults (``catalog.CHECKPOINT_FAULTS``), injected where real ones happen.

* While writing: rank 1's DCP writer gets a file system whose shard files (``*.distcp``) fail --
  ``enospc`` raises ENOSPC when the shard is opened; ``kill_mid_save`` / ``kill_stager``
  write the shard, cut it to half its size and SIGKILL the writing process: the rank itself for
  sync and async_thread saves, the rank's stager process for async_process saves (the writer
  is pickled into it).
* After the save: ``truncate_shard`` cuts rank 1's shard file to half, ``missing_metadata``
  removes ``.metadata`` (rank 0 does it; every rank then sees the broken checkpoint).

The harness must turn each into a clear per-case error naming the checkpoint, never load
from the broken checkpoint, and leave no process behind (tests/test_checkpoint_faults.py).
"""

from __future__ import annotations

import errno
import os
import signal
from contextlib import contextmanager
from pathlib import Path

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

FAULT_RANK = 1  # the rank whose writer or shard file the fault strikes
WHILE_WRITING = {"enospc": ("sync", "async_thread", "async_process"),
                 "kill_mid_save": ("sync", "async_thread"),
                 "kill_stager": ("async_process",)}
AFTER_SAVE = ("truncate_shard", "missing_metadata")


class _FaultyFileSystem(FileSystem):
    """DCP's local file system, except that shard files fail the way ``fault`` says."""

    def __init__(self, fault: str):
        super().__init__()
        self.fault = fault

    @contextmanager
    def create_stream(self, path, mode):
        if "w" not in mode or not str(path).endswith(".distcp"):
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        if self.fault == "enospc":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        with super().create_stream(path, mode) as stream:
            yield stream
        os.truncate(path, os.path.getsize(path) // 2)  # half a shard on disk, then it dies
        os.kill(os.getpid(), signal.SIGKILL)


def storage_writer(fault: str, mode: str, path: Path, rank: int):
    """The DCP storage writer for the case's main save: a faulty one on ``FAULT_RANK`` when
    ``fault`` strikes while writing, else None (DCP's default writer)."""
    if fault not in WHILE_WRITING or rank != FAULT_RANK:
        return None
    if mode not in WHILE_WRITING[fault]:
        raise RuntimeError(f"fault {fault} needs dcp: {' or '.join(WHILE_WRITING[fault])} "
                           f"(the case saves {mode})")
    writer = FileSystemWriter(str(path))
    writer.fs = _FaultyFileSystem(fault)
    return writer


def after_save(fault: str, path: Path, rank: int) -> None:
    """Break the finished checkpoint at ``path`` (rank 0 alone touches the files)."""
    if fault not in AFTER_SAVE or rank != 0:
        return
    path = Path(path)
    if fault == "missing_metadata":
        (path / ".metadata").unlink()
        return
    shard = path / f"__{FAULT_RANK}_0.distcp"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size // 2)
