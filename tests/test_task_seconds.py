"""The tasks' seconds a run leaves in pytest's cache for the next run's scheduler
(harness/speed/task_seconds.py): merged, per device type, nothing without a cache."""

import json
import subprocess
import sys
from types import SimpleNamespace

from forked import FORK
from subprocs import harness_env, one_case_scenario

from harness.speed import task_seconds


class FakeCache:
    def __init__(self):
        self.data = {}

    def get(self, key, default):
        return self.data.get(key, default)

    def set(self, key, value):
        self.data[key] = json.loads(json.dumps(value))


def test_seconds_merge_per_device_and_need_a_cache():
    config = SimpleNamespace(cache=FakeCache())
    task_seconds.store(config, "cuda", {"a.train": 1.23456, "b.train": 2.0})
    task_seconds.store(config, "cuda", {"b.train": 3.0})  # a run of b only: a keeps its time
    task_seconds.store(config, "cpu", {"a.train": 9.0})
    assert task_seconds.load(config, "cuda") == {"a.train": 1.235, "b.train": 3.0}
    assert task_seconds.load(config, "cpu") == {"a.train": 9.0}
    config.cache.data[task_seconds.KEY.format(device="cuda")] = {"a": "x", "b": -1, "c": 2}
    assert task_seconds.load(config, "cuda") == {"c": 2.0}  # what is not a time is dropped
    config.cache.data[task_seconds.KEY.format(device="cuda")] = ["not", "a", "dict"]
    assert task_seconds.load(config, "cuda") == {}
    bare = SimpleNamespace()  # -p no:cacheprovider: no config.cache
    task_seconds.store(bare, "cuda", {"a.train": 1.0})
    assert task_seconds.load(bare, "cuda") == {}


def test_a_run_leaves_its_tasks_seconds_in_pytest_s_cache(tmp_path):
    scen = one_case_scenario(tmp_path, "secs", "task seconds in the cache")
    cache = tmp_path / "cache"

    def run(n: int) -> dict:
        reports = tmp_path / f"reports{n}"
        argv = [sys.executable, "-m", "pytest", "-p", "harness.plugin", "-o",
                f"cache_dir={cache}", "--scenario", "secs", "--scenario-dir", str(scen),
                "--report-dir", str(reports), "-q", *FORK]
        p = subprocess.run(argv, cwd=tmp_path, env=harness_env(), capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        return json.loads(next((reports / "runs").glob("*/meta.json")).read_text())

    first = run(1)
    assert first["task_seconds_known"] == "0 of 1"
    # the run's task records: what the scaling model and its first-use measure read
    (rec,) = first["tasks"]
    assert rec["module"] == "Linear" and rec["recipe"] == "fp32" and "pg" in rec
    assert rec["launch"] and rec["started"] > 0 and rec["seconds"] > 0
    stored = json.loads((cache / "v" / "harness" / "task-seconds" / "cpu").read_text())
    assert list(stored) == ["secs.torch.fp32-dp2-Linear-sync-none.train"]
    assert 0 < stored["secs.torch.fp32-dp2-Linear-sync-none.train"] < 120
    assert run(2)["task_seconds_known"] == "1 of 1"  # the next run's scheduler has it
