"""Launcher pieces that need no launch: GPU slot packing and how a batch is split over slots."""

from pathlib import Path

from harness.launch.launcher import Launcher, Task, TaskResult
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent


def test_slots_pack_world_size_chunks_of_visible_gpus(tmp_path):
    launcher = Launcher(tmp_path, "te", "cuda", gpus=["3", "4", "5", "6", "7"])
    assert launcher.slots(2) == [{"CUDA_VISIBLE_DEVICES": "3,4"}, {"CUDA_VISIBLE_DEVICES": "5,6"}]
    assert launcher.slots(4) == [{"CUDA_VISIBLE_DEVICES": "3,4,5,6"}]
    assert Launcher(tmp_path, "torch", "cpu").slots(2) == [{}]


def test_batch_is_spread_over_slots_keeping_each_case_together(tmp_path, monkeypatch):
    cases = [c for c in expand(load_scenario(ROOT / "scenarios" / "smoke.yaml"))
             if c.world_sizes[0] == 4]
    tasks = []
    for c in cases:
        tasks.append(Task(f"{c.key}.train", c, "train", tmp_path))
        if c.target and c.target.world_size == 4:
            tasks.append(Task(f"{c.key}.reshard", c, "reshard", tmp_path))
    launcher = Launcher(tmp_path, "torch", "cuda", gpus=[str(i) for i in range(8)])
    seen = []

    def fake_chunk(chunk, world, env):
        seen.append((env["CUDA_VISIBLE_DEVICES"], [t.name for t in chunk]))
        return {t.name: TaskResult(t.name, "ok") for t in chunk}

    monkeypatch.setattr(launcher, "_run_chunk", fake_chunk)
    results = launcher.run_batch(tasks, 4)
    assert set(results) == {t.name for t in tasks}
    assert sorted(env for env, _ in seen) == ["0,1,2,3", "4,5,6,7"]
    for _, names in seen:  # train and reshard of one case never split across launches
        keys = {n.rsplit(".", 1)[0] for n in names}
        for k in keys:
            assert all(t.name in names for t in tasks if t.case.key == k)
