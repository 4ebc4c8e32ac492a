"""The nightly GPU workflow and the Slurm script stay consistent with the scenarios."""

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import yaml

from harness.launch import procs
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
    # pytest's cache outlives the checkout: task seconds and on-demand populations persist
    assert "no:cacheprovider" not in run and run.count("python -m pytest $PYTEST_CACHE ") == 3
    # plain torch on a GPU too (its TP crashed on shared GPUs with no night to see it), judged
    # by the same night check: its junit files match the night's glob
    assert "--backend torch --device cuda ${{ matrix.select }}" in run
    assert "reports/junit-torch-$s-${{ matrix.world }}.xml" in run
    assert gpu["env"]["PYTEST_CACHE"].startswith("-o cache_dir=${{ github.workspace }}/../")
    assert gpu["env"]["PYTEST_CACHE"].endswith("/${{ matrix.world }}")
    report = "\n".join(step.get("run", "") for step in wf["jobs"]["report"]["steps"])
    assert "harness report" in report and "harness drift" in report and "--fail-on-drift" in report
    for var in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        assert var in gpu["env"]


def test_slurm_script_uses_the_multinode_options():
    text = (ROOT / "ci" / "slurm" / "nightly_multinode.sbatch").read_text()
    for opt in ("--nnodes", "--rdzv-endpoint", "--node-launcher", "--work-dir", "srun",
                '-o cache_dir="$HOME/.cache/'):
        assert opt in text
    assert "no:cacheprovider" not in text


SIDE_BY_SIDE = "bash ci/side_by_side.sh"


def _ci_commands() -> list[str]:
    """.ci/run's commands, continuation lines joined, comments dropped; each command that
    ci/side_by_side.sh runs is a command of its own."""
    text = (ROOT / ".ci" / "run").read_text().replace("\\\n", " ")
    lines = [" ".join(ln.split()) for ln in text.splitlines()
             if ln.strip() and not ln.strip().startswith("#")]
    out = []
    for ln in lines:
        if ln.startswith(SIDE_BY_SIDE):
            out += [" ".join(c.split()) for c in shlex.split(ln[len(SIDE_BY_SIDE):])]
        else:
            out.append(ln)
    return out


def test_side_by_side_shows_every_log_in_order_and_fails_if_any_command_fails():
    """ci/side_by_side.sh (.ci/run's two scenario runs): the logs in the order given, whichever
    ends first; exit 1 if any command failed, 0 if none did."""
    script = str(ROOT / "ci" / "side_by_side.sh")

    def run(*cmds):
        p = subprocess.run(["bash", script, *cmds], capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout

    rc, out = run("sleep 1; echo first", "echo second")
    assert rc == 0 and out.index("first") < out.index("second"), out
    rc, out = run("echo ok", "echo broken; exit 3")
    assert rc == 1 and "ok" in out and "broken" in out and "a command failed" in out
    assert run("exit 2", "true")[0] == 1
    # stopped, it stops its commands: nothing outlives it
    marker = f"{317 + os.getpid() % 100}.5"
    p = subprocess.Popen(["bash", script, f"sleep {marker}", "true"])
    deadline = time.monotonic() + 10
    while not _sleeping(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sleeping(marker)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) != 0
    deadline = time.monotonic() + 5
    while _sleeping(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _sleeping(marker)


def _sleeping(marker: str) -> bool:
    """A ``sleep MARKER`` process is alive (read from /proc)."""
    return any(procs.cmdline(int(d.name)) == f"sleep {marker}"
               for d in Path("/proc").iterdir() if d.name.isdigit())


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


def _junit(path, tests, failures=0, errors=0, skipped=0, xfailed=0):
    """A junit file as pytest writes it: an xfailed case is a testcase with a ``skipped``
    element of type pytest.xfail, counted in the suite's skipped."""
    cases = "".join('<testcase name="x"><skipped type="pytest.xfail" message="entry 1"/>'
                    "</testcase>" for _ in range(xfailed))
    path.write_text(f'<testsuites><testsuite name="pytest" tests="{tests}" failures="{failures}" '
                    f'errors="{errors}" skipped="{skipped + xfailed}">{cases}</testsuite>'
                    "</testsuites>")
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
    # xfailed cases were checked (failed as registered): 95 passed + 65 xfailed = 160
    xf = _junit(tmp_path / "xf.xml", tests=870, skipped=710, xfailed=65)
    assert night(xf, least=160) == (0, "")
    assert night(xf, least=161)[0] == 1


# --- the README's GPU set-up: TransformerEngine's own install first, then the offline bundle ---
def _gpu_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("### Real TransformerEngine on GPU")
    return readme[start:readme.index("\n## ", start)]


def test_readme_gpu_setup_names_only_what_the_project_has():
    text = _gpu_section()
    blocks = [b.split("```")[0] for b in text.split("```bash")[1:]]
    assert 'pip install --no-build-isolation "transformer_engine[pytorch]"' in blocks[0]
    assert "--backend te" in blocks[0] and ".tebundle" not in blocks[0]  # no bundle needed
    assert "bash ci/te-bundle/bundle.sh" in blocks[1] and "source .tebundle/install.sh" in blocks[1]
    assert "../" not in text, "the set-up must not point outside the repository"
    for word in " ".join(blocks).split():
        if word.startswith("ci/"):
            assert (ROOT / word).exists(), word


def test_te_bundle_scripts_parse_and_fill_the_install_template():
    import shutil
    import subprocess
    d = ROOT / "ci" / "te-bundle"
    for script in ("bundle.sh", "install.sh"):
        if shutil.which("bash"):
            subprocess.run(["bash", "-n", str(d / script)], check=True, timeout=30)
    template = (d / "install.sh").read_text()
    bundle = (d / "bundle.sh").read_text()
    for key in {w.split("@")[1] for w in template.split() if w.count("@") >= 2}:
        assert f"@{key}@" in bundle, f"bundle.sh does not fill @{key}@ of install.sh"
    assert "/.tebundle/" in (ROOT / ".gitignore").read_text().splitlines()


def _fatbin_elf(entries: list[tuple[int, bytes]]) -> tuple[bytearray, dict]:
    """A 64-bit little-endian ELF file with one .nv_fatbin section holding one fatbin (after 8
    bytes of padding) whose entries are (SM arch, payload); also where each payload is."""
    import struct
    names = b"\0.shstrtab\0.nv_fatbin\0"
    body, where = bytearray(), {}
    for arch, payload in entries:
        head = bytearray(64)
        struct.pack_into("<HHIQ", head, 0, 2, 0x101, 64, len(payload))
        struct.pack_into("<I", head, 28, arch)
        where[arch] = (len(body) + 64, len(payload))
        body += head + payload
    fatbin = bytes(8) + struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body
    elf = bytearray(64) + names
    elf += bytes(-len(elf) % 8)
    fat_at = len(elf)
    elf += fatbin
    elf += bytes(-len(elf) % 8)
    table = len(elf)
    sections = [(0, 0, 0, 0), (1, 3, 64, len(names)), (11, 1, fat_at, len(fatbin))]
    for name, kind, offset, size in sections:
        elf += struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, offset, size, 0, 0, 1, 0)
    elf[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", elf, 0x28, table)
    struct.pack_into("<HHH", elf, 0x3A, 64, len(sections), 1)
    body_at = fat_at + 8 + 16
    return elf, {a: (body_at + off, n) for a, (off, n) in where.items()}


def test_strip_fatbin_zeroes_the_other_architectures_only(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "strip_fatbin", ROOT / "ci" / "te-bundle" / "strip_fatbin.py")
    strip_fatbin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(strip_fatbin)
    elf, at = _fatbin_elf([(80, b"\x11" * 40), (90, b"\x22" * 24), (100, b"\x33" * 16)])
    lib = tmp_path / "lib.so"
    lib.write_bytes(bytes(elf))
    assert strip_fatbin.main([str(lib), "90,100"]) == 0
    out = lib.read_bytes()
    assert len(out) == len(elf)
    part = {a: out[o:o + n] for a, (o, n) in at.items()}
    assert part == {80: bytes(40), 90: b"\x22" * 24, 100: b"\x33" * 16}
    untouched = bytearray(elf)
    for o, n in (at[80],):
        untouched[o:o + n] = bytes(n)
    assert out == bytes(untouched)  # headers and everything else as they were


def test_the_slow_files_handed_out_first_exist():
    """tests/conftest.py's SLOW_FILES orders the README test command's xdist files: a renamed
    or split file must be renamed there too, or it silently goes back to the end of the run."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("tests_conftest", ROOT / "tests" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    SLOW_FILES = conftest.SLOW_FILES
    missing = [f for f in SLOW_FILES if not (ROOT / f).is_file()]
    assert not missing, missing
    assert list(SLOW_FILES.values()) == sorted(SLOW_FILES.values(), reverse=True)


def _gpu_bench(tmp_path, gpus: int) -> list[list[str]]:
    env = {**os.environ, "BENCH_DRY": "1", "BENCH_GPUS": str(gpus), "PYTHON": "py"}
    p = subprocess.run(["bash", str(ROOT / "ci" / "gpu_bench.sh"), str(tmp_path / "out"), "x"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return [shlex.split(line) for line in p.stdout.splitlines()]


def test_gpu_bench_runs_the_figures_of_performance_md(tmp_path):
    """ci/gpu_bench.sh: the whole TE matrix (first, warm) and its 2-rank half twice, each a
    bounded `harness bench` in a results store of its own; on several GPUs the same host with
    GPU 0 alone and the case-by-case comparison of the two whole runs."""
    one, keep = _gpu_bench(tmp_path, 1)[:-1], _gpu_bench(tmp_path, 1)[-1]
    assert keep[:2] == ["tar", "-czf"] and keep[2] == str(tmp_path / "out" / "x-stores.tar.gz")
    assert [c[c.index("--label") + 1] for c in one] == \
        ["x-whole-first", "x-whole", "x-2rank-1", "x-2rank-2"]
    for cmd in one:
        assert cmd[:3] == ["env", "timeout", "300"] and cmd[3:6] == ["py", "-m", "harness"]
        args = cmd[cmd.index("--") + 1:]
        assert args[:6] == ["-p", "harness.plugin", "--scenario", "fsdp2_tp_dcp", "--backend",
                            "te"] and "--report-dir" in args
        assert cmd[cmd.index("--out") + 1] == str(tmp_path / "out")
    assert one[2][-2:] == one[3][-2:] == ["--max-world-size", "2"]
    two = _gpu_bench(tmp_path, 2)[:-1]  # less the stores' tar
    labels = [c[c.index("--label") + 1] for c in two[:-1]]
    assert labels == ["x-whole-first", "x-whole", "x-2rank-1", "x-2rank-2", "x-gpu0-whole",
                      "x-gpu0-2rank"]  # the host's own runs first, GPU 0 alone after them
    gpu0 = [c for c in two if "CUDA_VISIBLE_DEVICES=0" in c]
    assert [c[c.index("--label") + 1] for c in gpu0] == ["x-gpu0-whole", "x-gpu0-2rank"]
    compare = two[-1]
    whole = two[1][two[1].index("--report-dir") + 1]
    assert compare[:4] == ["py", "-m", "harness", "compare"]
    assert compare[compare.index("--a") + 1] == whole + "/history"
    assert compare[compare.index("--out") + 1] == str(tmp_path / "out" / "x-nccl-vs-gpu0.md")


def test_gpu_ab_alternates_after_a_warm_up_and_judges_with_harness_ab(tmp_path):
    """ci/gpu_ab.sh: a warm-up run of A, then A B B A (a machine's drift over the call favours
    neither side), each a bounded bench of the TE matrix; a leading VAR=VALUE of a side's
    arguments is its environment; the runs go to `python -m harness ab` in that order."""
    env = {**os.environ, "BENCH_DRY": "1", "PYTHON": "py"}
    p = subprocess.run(["bash", str(ROOT / "ci" / "gpu_ab.sh"), str(tmp_path / "out"), "x", "2",
                        "--max-world-size 2", "X=1 --max-world-size 2 --accelerations all"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    cmds = [shlex.split(line) for line in p.stdout.splitlines()]
    labels = [c[c.index("--label") + 1] for c in cmds[:-1]]
    assert labels == ["x-warmup", "x-a1", "x-b1", "x-b2", "x-a2"]
    for cmd in cmds[:-1]:
        b = cmd[cmd.index("--label") + 1].startswith("x-b")
        assert cmd[:4 if b else 3] == ["env", *(["X=1"] if b else []), "timeout", "300"]
        assert ("X=1" in cmd) == b
        args = cmd[cmd.index("--") + 1:]
        assert args[:6] == ["-p", "harness.plugin", "--scenario", "fsdp2_tp_dcp", "--backend",
                            "te"] and args[6:8] == ["--max-world-size", "2"]
        assert ("--accelerations" in args) == b
    out = str(tmp_path / "out")
    assert cmds[-1] == ["py", "-m", "harness", "ab", "--a", f"{out}/x-a1.json", f"{out}/x-a2.json",
                        "--b", f"{out}/x-b1.json", f"{out}/x-b2.json"]
