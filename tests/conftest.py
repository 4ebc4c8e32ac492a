import os
from pathlib import Path

import pytest

# The tests choose their results stores themselves (--report-dir, --store, tmp dirs): a user's
# $HARNESS_RESULTS must not redirect the runs they start and read back.
os.environ.pop("HARNESS_RESULTS", None)

ROOT = Path(__file__).resolve().parent.parent
TEST_SCENARIOS = Path(__file__).resolve().parent / "scenarios"

# The slowest test files, with their seconds in one `pytest -n 2 --dist loadfile` run of the
# suite (the 60 longest tests' durations summed per file, a 2-core machine: what counts is their
# order). xdist's loadfile hands out whole
# files, by default the files with the most tests first: these few-test files of long launches
# came last, and the run ended with one worker on its last long file while the other had
# nothing left. The README's test command hands them out first (longest processing time first);
# the other files follow in xdist's order. A file not listed costs no correctness, only balance.
SLOW_FILES = {
    "tests/test_interrupt.py": 190,
    "tests/test_unseen_config.py": 155,
    "tests/test_no_leaks.py": 110,
    "tests/test_sized_bugs.py": 90,
    "tests/test_rank_server.py": 90,
    "tests/test_plugin.py": 80,
    "tests/test_unseen_config_torch.py": 75,
    "tests/test_checkpoint_faults.py": 65,
    "tests/test_negative_controls.py": 60,
    "tests/test_accelerations.py": 50,
    "tests/test_launch_setup.py": 50,
    "tests/test_shared_train.py": 40,
    "tests/test_bench.py": 35,
    "tests/test_launch_env.py": 30,
    "tests/test_quiet_run.py": 30,
    "tests/test_tp_twin.py": 30,
    "tests/test_concurrent_runs.py": 25,
    "tests/test_rank_profile.py": 25,
    "tests/test_multinode.py": 25,
    "tests/test_model_controls.py": 25,
    "tests/report/test_report_content.py": 20,
    "tests/test_task_seconds.py": 20,
    "tests/test_export.py": 15,
}


def pytest_configure(config):
    """xdist controller, ``--dist loadfile``: keep the order the workers collected (below)."""
    if getattr(config.option, "dist", "no") in ("loadfile", "loadscope"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """xdist workers: the files of SLOW_FILES first, slowest first; then every other file,
    those with the most tests first (xdist's own order). Each file's tests keep their order.
    A run without xdist, or of a scenario (its cases are no test files), keeps pytest's order."""
    if not hasattr(config, "workerinput") or \
            not all(item.nodeid.startswith("tests/") for item in items):
        return
    files: dict[str, int] = {}
    for item in items:
        f = item.nodeid.split("::", 1)[0]
        files[f] = files.get(f, 0) + 1
    rank = {f: i for i, f in enumerate(sorted(files, key=lambda f: (-SLOW_FILES.get(f, 0),
                                                                    -files[f])))}
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])


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
