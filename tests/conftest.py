import os
from pathlib import Path

import pytest

# The tests choose their results stores themselves (--report-dir, --store, tmp dirs): a user's
# $HARNESS_RESULTS must not redirect the runs they start and read back.
os.environ.pop("HARNESS_RESULTS", None)

ROOT = Path(__file__).resolve().parent.parent
TEST_SCENARIOS = Path(__file__).resolve().parent / "scenarios"


@pytest.fixture(scope="session", autouse=True)
def no_temporary_directories_of_dead_runs_left():
    """The suite leaves nothing in /tmp or /dev/shm (issue 29): no run it killed may leave a
    temporary directory behind (``launch.scratch``; tests that kill a run give it a TMPDIR and
    work dir of their own, and remove or sweep what it left)."""
    from harness.launch import scratch
    before = set(scratch.leftovers(scratch.parents()))
    yield
    left = sorted(set(scratch.leftovers(scratch.parents())) - before)
    assert not left, f"temporary directories of dead runs were left behind: {left}"


@pytest.fixture
def write_yaml(tmp_path):
    """Write a YAML text to tmp_path/<name>.yaml and return the path."""
    def _write(name: str, text: str) -> Path:
        p = tmp_path / f"{name}.yaml"
        p.write_text(text)
        return p
    return _write


@pytest.fixture
def fake_world():
    """``init(world)``: this process as rank 0 of a ``world``-rank process group over torch's
    fake backend (no peers: collectives return at once), destroyed after the test."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def init(world):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    yield init
    if dist.is_initialized():
        dist.destroy_process_group()
