"""Launcher pieces that need no launch: GPU slot packing."""

from pathlib import Path

from harness.launch.launcher import Launcher

ROOT = Path(__file__).resolve().parent.parent


def test_slots_pack_world_size_chunks_of_visible_gpus(tmp_path):
    launcher = Launcher(tmp_path, "te", "cuda", gpus=["3", "4", "5", "6", "7"])
    assert launcher.slots(2) == [{"CUDA_VISIBLE_DEVICES": "3,4"}, {"CUDA_VISIBLE_DEVICES": "5,6"}]
    assert launcher.slots(4) == [{"CUDA_VISIBLE_DEVICES": "3,4,5,6"}]
    assert Launcher(tmp_path, "torch", "cpu").slots(2) == [{}]
