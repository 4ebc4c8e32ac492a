"""The GPU-memory release check after a launch (harness/launch/gpu.py): parsing nvidia-smi, the
bounded wait, and the launcher recording what is still held -- on CPU, with a fake query."""

import subprocess
import sys
import types

from harness.launch import gpu, procs
from harness.launch.ending import end_processes

# the format nvidia-smi prints ("pid, MiB" a line, e.g. "680, 1030" for a process holding 1 GiB)
SMI = """\
12345, 1024
12345, 512
777, [N/A]
not a line
"""


def test_parse_compute_apps_sums_gpus_and_keeps_unreadable_usage():
    assert gpu.parse_compute_apps(SMI) == {12345: 1536, 777: 0}


def test_wait_released_is_bounded_and_names_what_is_held():
    answers = iter([{5: 100, 6: 7}, {5: 100}, {}])
    assert gpu.wait_released({5}, timeout_s=10, poll_s=0.01, query=lambda: next(answers)) == []
    held = gpu.wait_released({5, 9}, timeout_s=0.1, poll_s=0.01, query=lambda: {5: 100, 8: 1})
    assert held == ["pid 5 holds 100 MiB"]


def test_without_nvidia_smi_nothing_is_reported():
    assert gpu.compute_apps(smi="/nonexistent/nvidia-smi") is None
    assert gpu.wait_released({1}, timeout_s=0.1, query=lambda: None) == []


def test_launcher_on_cuda_waits_for_the_launch_pids_and_records_held_memory(tmp_path,
                                                                             monkeypatch):
    asked = []

    def fake_wait(pids, timeout_s):
        asked.append(set(pids))
        return ["pid 42 holds 9 MiB"]

    monkeypatch.setattr(gpu, "wait_released", fake_wait)
    tag = procs.new_tag("gpu-test")
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             env={procs.TAG_VAR: tag}, start_new_session=True)
    def ended(device, agents, tag, d, plan):  # only what end_processes reads
        launch = types.SimpleNamespace(
            settings=types.SimpleNamespace(device=device, gentle_stop=False), agents=agents,
            agent_ids=procs.identities([a.pid for a in agents]), tag=tag, d=d, plan_path=plan,
            tmp=None)
        return end_processes(launch)

    (tmp_path / "progress").mkdir()
    out = ended("cuda", [agent], tag, tmp_path, tmp_path / "plan.json")
    assert agent.poll() is not None  # killed and reaped
    assert out["gpu_held"] == ["pid 42 holds 9 MiB"] and out["leaked"] == []
    assert agent.pid in asked[0]
    cpu = ended("cpu", [], tag, tmp_path, tmp_path / "p")
    assert cpu == dict(killed=0, leaked=[], gpu_held=[]) and len(asked) == 1  # CPU never asks
