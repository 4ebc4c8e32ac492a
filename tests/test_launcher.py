"""Launcher pieces that need no launch: GPU slot packing."""

from pathlib import Path

from harness.launch.launcher import Launcher
from harness.speed import layers

ROOT = Path(__file__).resolve().parent.parent


def test_slots_pack_world_size_chunks_of_visible_gpus(tmp_path):
    gpus = ["3", "4", "5", "6", "7"]
    plain = Launcher(tmp_path, "te", "cuda", gpus=gpus,
                     env=layers.parse("all,-lanes_per_gpu").env())
    assert plain.slots(2) == [{"CUDA_VISIBLE_DEVICES": "3,4"}, {"CUDA_VISIBLE_DEVICES": "5,6"}]
    assert plain.slots(4) == [{"CUDA_VISIBLE_DEVICES": "3,4,5,6"}]
    # lanes_per_gpu: a slice of g GPUs takes g times one GPU's launch (a rank a GPU each)
    launcher = Launcher(tmp_path, "te", "cuda", gpus=gpus)
    assert launcher.slots(2) == [{"CUDA_VISIBLE_DEVICES": "3,4"},
                                 {"CUDA_VISIBLE_DEVICES": "5,6"}] * 2
    assert launcher.slots(4) == [{"CUDA_VISIBLE_DEVICES": "3,4,5,6"}] * 4
    assert Launcher(tmp_path, "torch", "cpu").slots(2) == [{}]


def test_a_teardown_that_outlasts_a_case_timeout_ends_the_launch(tmp_path):
    """Every task delivered and the feed closed, ranks stuck in their teardown (a process
    group's destroy that never returns): the watch ends after a case's timeout instead of
    waiting for the agents forever (their processes are then killed and the launch recorded
    as timed out)."""
    import threading
    import time
    from types import SimpleNamespace

    from harness.launch.launch import Launch
    launch = Launch.__new__(Launch)
    (tmp_path / "progress").mkdir()
    (tmp_path / "results").mkdir()
    launch.d, launch.agents = tmp_path, [SimpleNamespace(poll=lambda: None)]  # never exits
    launch.stop, launch.closed, launch.timeout_s = threading.Event(), True, 0.3
    launch.by_name, launch.delivered = {"t": object()}, {"t": object()}
    launch.t_start, launch._pump = time.time(), lambda: None
    got = []
    watch = threading.Thread(target=lambda: got.append(launch._watch()), daemon=True)
    watch.start()
    watch.join(timeout=10)
    launch.stop.set()  # the old code waited on: stop it (Interrupted in its thread)
    assert got == [(None, True)]
