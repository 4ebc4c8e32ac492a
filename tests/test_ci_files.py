"""The nightly GPU workflow and the Slurm script stay consistent with the scenarios."""

from pathlib import Path

import yaml

from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent


def test_nightly_workflow_shards_every_te_world_size():
    wf = yaml.safe_load((ROOT / "ci" / "nightly-gpu.yml").read_text())
    gpu = wf["jobs"]["gpu"]
    jobs = gpu["strategy"]["matrix"]["include"]
    worlds = {m["world"] for m in jobs}
    needed = set()
    for name in ("fsdp2_tp_dcp", "te_fused_adam"):
        needed |= {max(c.world_sizes) for c in expand(load_scenario(ROOT / "scenarios" / f"{name}.yaml"), "te")}
    assert needed <= worlds, f"no GPU runner for world sizes {needed - worlds}"
    run = "\n".join(step.get("run", "") for step in gpu["steps"])
    assert "${{ matrix.select }}" in run and "--backend te" in run
    for m in jobs:  # NCCL runners a GPU per rank; the 1-GPU runner shares it
        assert (m["select"] == f"--world-size {m['world']} --gpu-share never"
                if m["world"] != "shared" else m["select"] == "--gpu-share auto"), m
        assert m["min_checked"] > 0
    assert "ci/night_check.py --min-checked ${{ matrix.min_checked }}" in run
    assert "|| true" not in (ROOT / "ci" / "nightly-gpu.yml").read_text()
    report = "\n".join(step.get("run", "") for step in wf["jobs"]["report"]["steps"])
    assert "harness report" in report and "harness drift" in report and "--fail-on-drift" in report
    for var in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        assert var in gpu["env"]


def test_slurm_script_uses_the_multinode_options():
    text = (ROOT / "ci" / "slurm" / "nightly_multinode.sbatch").read_text()
    for opt in ("--nnodes", "--rdzv-endpoint", "--node-launcher", "--work-dir", "srun"):
        assert opt in text


def _ci_commands() -> list[str]:
    """.ci/run's commands, continuation lines joined, comments dropped."""
    text = (ROOT / ".ci" / "run").read_text().replace("\\\n", " ")
    return [" ".join(ln.split()) for ln in text.splitlines()
            if ln.strip() and not ln.strip().startswith("#")]


def test_ci_ends_with_the_readme_test_command():
    """CI counts the closing pytest line: it must be the README's test command (which executes
    tests), not a scenario run that may legitimately end all-skipped (e.g. --backend te on CPU)."""
    readme = (ROOT / "README.md").read_text()
    blocks = [b.split("```")[0].strip() for b in readme.split("```bash")[1:3]]
    test_cmd = blocks[1]
    assert test_cmd.split(" && ")[-1].startswith(".venv/bin/python -m pytest"), test_cmd
    assert "--scenario" not in test_cmd, test_cmd  # the harness's own tests, not a scenario
    lines = _ci_commands()
    pytest_lines = [ln for ln in lines if "pytest" in ln]
    assert pytest_lines[-1] == test_cmd, pytest_lines[-1]
    assert blocks[0] in lines, "README command 1 must run in CI"


def test_ci_runs_the_model_scenarios_before_the_readme_test_command():
    """LlamaStack (torch, the reference slice, te skips), the bring-your-own-model example and
    the fix verification run in CI, before the closing test command; the README's example
    command is the one CI runs."""
    runs = [ln.split() for ln in _ci_commands() if "pytest" in ln][:-1]

    def ran(*words):
        return any(all(w in r for w in words) for r in runs)

    assert ran("examples/my_model/my_model.yaml")
    assert ran("llama_stack", "--backend", "reference", "-m", "ci")
    assert ran("fix_verification", "--backend", "reference")
    assert ran("llama_stack", "--backend", "te")
    assert "--scenario examples/my_model/my_model.yaml" in (ROOT / "README.md").read_text()
    assert load_scenario(ROOT / "examples" / "my_model" / "my_model.yaml").models


def _junit(path, tests, failures=0, errors=0, skipped=0):
    path.write_text(f'<testsuites><testsuite name="pytest" tests="{tests}" failures="{failures}" '
                    f'errors="{errors}" skipped="{skipped}"/></testsuites>')
    return str(path)


def test_night_check_fails_a_night_that_checked_too_little(tmp_path):
    """An all-skip night, a crashed scenario (no junit), a failure: each fails the night."""
    import subprocess
    import sys
    script = str(ROOT / "ci" / "night_check.py")

    def night(*files, least=10):
        out = subprocess.run([sys.executable, script, "--min-checked", str(least), *files],
                             capture_output=True, text=True, timeout=60)
        return out.returncode, out.stdout

    good = _junit(tmp_path / "a.xml", tests=20, skipped=5)
    assert night(good) == (0, "")
    rc, out = night(_junit(tmp_path / "skip.xml", tests=870, skipped=870))
    assert rc == 1 and "only 0 case(s) checked" in out
    rc, out = night(good, str(tmp_path / "missing.xml"))
    assert rc == 1 and "no readable junit file" in out
    rc, out = night(good, _junit(tmp_path / "f.xml", tests=3, failures=1))
    assert rc == 1 and "1 failed, 0 errors" in out
    assert night(good, least=16)[0] == 1  # 15 checked, 16 expected
