"""Issue 61 items 1-2: no registry regex, stop signal or scenario size can hang a run or eat
the machine. Each test bounds itself (a subprocess under a hard timeout / memory ceiling), so
code without the guards fails here instead of hanging the suite."""

import os
import resource
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from harness.verdict import registry_file
from harness.verdict.registry import Failure, RegistryError

AXES = {"recipe", "mesh", "module", "dcp", "reshard", "fixes"}
EVIL = "(.*.*.*.*.*.*.*)*Z$"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str, timeout: float, mem_bytes: int | None = None, **kw):
    """Run ``code`` in a fresh Python, killed after ``timeout`` s (and capped at ``mem_bytes``
    of address space): a hang or an explosion fails the test instead of stalling the suite."""
    def limit():
        if mem_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, preexec_fn=limit, env=env, cwd=ROOT, **kw)


def _registry(tmp_path, message: str):
    p = tmp_path / "known.yaml"
    p.write_text(textwrap.dedent(f"""\
        entries:
          - match: {{recipe: bf16}}
            fails: {{check: train, message: '{message}'}}
            reason: r
        """))
    return p


@pytest.mark.parametrize("message", [EVIL, "(a+)+$", ".*a.*b.*c.*d.*e"])
def test_backtracking_regex_refused_at_load(tmp_path, message):
    with pytest.raises(RegistryError) as e:
        registry_file.load(_registry(tmp_path, message), AXES)
    assert "known.yaml: line 3: entries[0] (entry 1).fails.message:" in str(e.value)
    assert "repeat" in str(e.value) and "\n" not in str(e.value)


def test_usual_messages_still_load(tmp_path):
    r = registry_file.load(_registry(tmp_path, r"Size mismatch .*exp_avg(\\.\\d+)?"), AXES)
    assert r.entries[0].fails[0].message.startswith("Size mismatch")


def test_every_match_is_time_limited():
    """A pattern that slipped past the load check (built in code) still ends: RegistryError
    naming the regex after the time limit, not minutes of backtracking."""
    out = _python(f"""
        import time
        from harness.verdict.registry import Failure, RegistryError
        f = Failure("train", message={EVIL!r})
        t = time.monotonic()
        try:
            f.matches(dict(check="train", quantity="error", detail="a" * 40))
        except RegistryError as e:
            print("ERR", round(time.monotonic() - t, 1), e)
        """, timeout=60)
    assert out.stdout.startswith("ERR"), out.stderr
    seconds = float(out.stdout.split()[1])
    assert seconds < 10 and "did not finish within 2 s on a detail of 40 characters" in out.stdout


def test_plain_matches_unchanged():
    f = Failure("train", message="plain tensor")
    assert f.matches(dict(check="train", quantity="error", detail="a plain tensor here"))
    assert not f.matches(dict(check="train", quantity="error", detail="other"))


def test_sigterm_ends_a_clean_up_that_never_ends():
    """SIGTERM while the end-of-run clean-up (signals held) is stuck: the run still ends
    within the grace, not never."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys
        from harness.launch import interrupt
        interrupt.install()
        with interrupt.deferred(grace_s=2):
            print("held", flush=True)
            while True:
                pass
        """)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        assert proc.stdout.readline().strip() == "held"
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        assert time.monotonic() - t < 10
        assert rc != 0 and "clean-up did not end within 2 s" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _smoke_with_seeds(tmp_path, n_seeds: int):
    text = open(os.path.join(ROOT, "scenarios", "smoke.yaml")).read()
    text = text.replace("  reshard: [none, to_dp2, to_dp4]\n",
                        "  reshard: [none, to_dp2, to_dp4]\n"
                        f"  seed: [{', '.join(map(str, range(n_seeds)))}]\n")
    text = text.replace("name: smoke", "name: huge")
    scen = tmp_path / "scen"
    scen.mkdir()
    (scen / "huge.yaml").write_text(text)
    return scen / "huge.yaml"


def test_a_matrix_past_the_limit_is_refused_at_collection(tmp_path):
    """4.5 million combinations: one line with the size and the axes, within a memory ceiling
    and a time limit (before: --collect-only grew to 24 GB until it was OOM-killed)."""
    path = _smoke_with_seeds(tmp_path, 10_000)
    out = _python(f"""
        import sys, pytest
        sys.exit(pytest.main(["-p", "harness.plugin", "-p", "no:cacheprovider", "-q",
                              "--collect-only", "--no-report", "--scenario", {str(path)!r},
                              "--rootdir", {str(tmp_path)!r}]))
        """, timeout=180, mem_bytes=6 << 30)
    text = out.stdout + out.stderr
    assert out.returncode == 4, text[-2000:]
    assert ("the axes multiply to 4,500,000 cases (recipe 2 x mesh 5 x module 5 x dcp 3 x "
            "reshard 3 x seed 10,000), more than the 100,000 a run may hold") in text


def test_duplicate_case_rows_are_an_error(tmp_path):
    from harness.spec.scenario import ScenarioError, load_scenario
    text = open(os.path.join(ROOT, "scenarios", "smoke.yaml")).read()
    row = "  - {recipe: fp32, mesh: dp2, module: LayerNormMLP, dcp: sync, reshard: to_dp4}\n"
    p = tmp_path / "smoke.yaml"
    p.write_text(text.replace(row, row + row.replace("{recipe: fp32, mesh: dp2",
                                                     "{mesh: dp2, recipe: fp32")))
    with pytest.raises(ScenarioError, match=r"smoke.yaml: cases\[1\]: repeats cases\[0\]"):
        load_scenario(p)
