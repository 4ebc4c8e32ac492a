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
