"""Test helper: a full filesystem -- a small tmpfs, filled, where one can be mounted (root with
``mount``; not with ``HARNESS_TEST_NO_TMPFS=1``), else a fake: a conftest that makes ``harness.launch.disk`` see no free space under
the directory."""

import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

FAKE_FULL = """
import harness.launch.disk as disk

FULL = {full!r}
_real_free = disk.free


def _free(directory):
    return 0 if str(disk.existing(directory)).startswith(FULL) else _real_free(directory)


def pytest_configure(config):
    disk.free = _free


def pytest_unconfigure(config):
    disk.free = _real_free
"""


@contextmanager
def full_dir(parent: Path, pytester=None):
    """A directory on a full filesystem: (path, how) -- "tmpfs" (a mounted 1 MiB tmpfs, filled
    by the file ``filler``) or "fake" (``pytester``'s conftest makes the harness see it
    full)."""
    d = Path(parent) / "full"
    d.mkdir()
    if not os.environ.get("HARNESS_TEST_NO_TMPFS") and os.geteuid() == 0 and \
            shutil.which("mount") and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)],
            capture_output=True).returncode == 0:
        try:
            try:
                with open(d / "filler", "wb") as f:
                    f.write(b"\0" * (2 << 20))
            except OSError:
                pass  # full
            yield d, "tmpfs"
        finally:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)
        return
    if pytester is not None:
        pytester.makeconftest(FAKE_FULL.format(full=str(d)))
    yield d, "fake"
