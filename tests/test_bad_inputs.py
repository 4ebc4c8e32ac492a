"""Every bad input is refused up front with one line naming the file or option, the field and
what is allowed -- nothing silently accepted, nothing crashing later. No launches: scenario
files are loaded directly, options run through pytest in-process (pytester)."""

import math
from pathlib import Path

import pytest

# before pytester's snapshot of sys.modules: it drops what a test imported, and torch's C
# extension fails a second import in one process (in-process runs that check models import it)
import torch  # noqa: F401

from harness.spec.matrix import expand
from harness.spec.scenario import ScenarioError, load_scenario

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent

BASE = """\
name: s
description: bad-input self-test
axes:
  recipe: [fp32]
  mesh: [dp2]
  module: [Linear]
  dcp: [sync]
  reshard: [none]
  fault: [none]
train: {steps: 2, lr: 0.01, seed: 1}
model: {hidden: 32}
tolerances: {fp32_parity: {fp32: {max_abs: 0.1, rel_l2: 0.1, reason: r}}}
timeout_s: 60
"""

EXTRA = "the extra axes fixes, optimizer, fault"
# id -> (old text, new text, fragments the one-line error must hold)
SCENARIO_CASES = {
    "duplicate top-level key": ("timeout_s: 60\n", "timeout_s: 60\naxes: {recipe: [bf16]}\n",
                                ["line 14: duplicate key 'axes' (first at line 3)"]),
    "duplicate axis": ("  mesh: [dp2]\n", "  mesh: [dp2]\n  mesh: [dp4]\n",
                       ["line 6: duplicate key 'mesh' (first at line 5)"]),
    "duplicate in flow mapping": ("{steps: 2,", "{steps: 2, steps: 3,",
                                  ["duplicate key 'steps'"]),
    "misspelt extra axis": ("  fault: [none]\n", "  fualt: [hang]\n",
                            ["axes.fualt: unknown axis", EXTRA]),
    "misspelt fault value": ("fault: [none]", "fault: [hnag]",
                             ["axes.fault[0]: unknown fault value 'hnag'; allowed: none,"]),
    "misspelt fixes value": ("fault: [none]", "fixes: [no_tp_dtensor]",
                             ["axes.fixes[0]: unknown fixes value", "no_tp_dtensor_params"]),
    "misspelt optimizer value": ("fault: [none]", "optimizer: [master]",
                                 ["axes.optimizer[0]: unknown optimizer value 'master'; "
                                  "allowed: master_weights, no_master_weights"]),
    "timeout_s yes": ("timeout_s: 60", "timeout_s: yes",
                      ["timeout_s (seconds per case): must be a number, got True",
                       "YAML reads yes / no / on / off as booleans"]),
    "timeout_s nan": ("timeout_s: 60", "timeout_s: .nan",
                      ["timeout_s (seconds per case): must be a finite number, got nan"]),
    "timeout_s inf": ("timeout_s: 60", "timeout_s: .inf", ["must be a finite number, got inf"]),
    "timeout_s 0": ("timeout_s: 60", "timeout_s: 0", ["must be > 0 and <= 86400, got 0"]),
    "timeout_s text": ("timeout_s: 60", "timeout_s: 1m", ["must be a number, got '1m'"]),
    "train.lr nan": ("lr: 0.01", "lr: .nan", ["train.lr: must be a finite number, got nan"]),
    "train.lr 0": ("lr: 0.01", "lr: 0", ["train.lr: must be > 0 and <= 10, got 0"]),
    "train.lr 1e-3": ("lr: 0.01", "lr: 1e-3",  # YAML 1.1: text, not a float
                      ["train.lr: must be a number, got '1e-3' (YAML 1.1 reads 1e-3 as text, not "
                       "a number: write it with a dot and a signed exponent, e.g. 1.0e-3)"]),
    "train.steps bool": ("steps: 2", "steps: true",
                         ["train.steps: must be an integer, got True"]),
    "train.seed negative": ("seed: 1", "seed: -1", ["train.seed: must be >= 0"]),
    # the data's generator seed (seed * 1_000_003 + step) must fit torch's int64
    "train.seed huge": ("seed: 1", "seed: 20000000000000",
                        ["train.seed: must be >= 0 and <= 9223344366821"]),
    "axes.seed huge": ("fault: [none]\n", "fault: [none]\n  seed: [20000000000000]\n",
                       ["seed values are integers from 0 to 9223344366821"]),
    "model.hidden float": ("hidden: 32", "hidden: 32.5", ["model.hidden: must be an integer"]),
    "model.hidden huge": ("hidden: 32", "hidden: 10000000", ["model.hidden: must be >= 1 and "
                                                              "<= 65536, got 10000000"]),
    "tolerance nan": ("max_abs: 0.1", "max_abs: .nan",
                      ["tolerances.fp32_parity.fp32.max_abs: must be a finite number"]),
    "tolerance bool": ("rel_l2: 0.1", "rel_l2: no",
                       ["tolerances.fp32_parity.fp32.rel_l2: must be a number, got False"]),
}


@pytest.mark.parametrize("old, new, fragments", SCENARIO_CASES.values(), ids=SCENARIO_CASES)
def test_bad_scenario_file(tmp_path, old, new, fragments):
    assert old in BASE
    path = tmp_path / "s.yaml"
    path.write_text(BASE.replace(old, new, 1))
    with pytest.raises(ScenarioError) as e:
        expand(load_scenario(path), "torch")
    msg = str(e.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg, msg
    for f in fragments:
        assert f in msg, msg


def test_base_scenario_is_valid(tmp_path):
    (tmp_path / "s.yaml").write_text(BASE)
    (case,) = expand(load_scenario(tmp_path / "s.yaml"), "torch")
    assert math.isclose(case.train.lr, 0.01) and case.timeout_s == 60


# --- options and selections: pytest in-process, collection only -----------------------------
def _run(pytester, *args):
    """Run the plugin in-process on a scenario dir holding BASE as s.yaml; (exit code, text)."""
    scen = pytester.path / "scen"
    scen.mkdir(exist_ok=True)
    (scen / "s.yaml").write_text(BASE)
    res = pytester.runpytest_inprocess("-p", "harness.plugin", "-p", "no:cacheprovider",
                                       "--scenario-dir", str(scen), *args)
    return res.ret, "\n".join(res.outlines + res.errlines)


def _files(pytester):
    (pytester.path / "afile").write_text("not a directory")
    a, b = pytester.path / "a", pytester.path / "b"
    a.mkdir()
    b.mkdir()
    (a / "s.yaml").write_text(BASE)
    (b / "s.yaml").write_text(BASE)
    (a / "q.yaml").write_text(BASE.replace("name: s", "name: q").replace("[fp32]", "[current]"))


OPTION_CASES = {
    "case-timeout 0": (["--case-timeout", "0"],
                       "--case-timeout 0: must be a number of seconds > 0 (and <= 86400)"),
    "case-timeout -1": (["--case-timeout", "-1"], "--case-timeout -1: must be a number of"),
    "case-timeout nan": (["--case-timeout", "nan"], "--case-timeout nan: must be a number of"),
    "max-world-size 0": (["--max-world-size", "0"], "--max-world-size 0: must be an integer >= 1"),
    "world-size 0": (["--world-size", "0"], "--world-size 0: must be an integer >= 1"),
    "nnodes 0": (["--nnodes", "0"], "--nnodes 0: must be an integer >= 1 and <= 1024"),
    "rdzv-endpoint no port": (["--nnodes", "2", "--rdzv-endpoint", "head"],
                              "--rdzv-endpoint 'head': expected HOST:PORT with a port in 1..65535"),
    "rdzv-endpoint bad port": (["--nnodes", "2", "--rdzv-endpoint", "head:99999"],
                               "--rdzv-endpoint 'head:99999': expected HOST:PORT"),
    "node-launcher quotes": (["--nnodes", "2", "--node-launcher", 'srun "--nodes=2'],
                             "--node-launcher 'srun \"--nodes=2': not a command line"),
    "work-dir under a file": (["--work-dir", "{tmp}/afile/work"],
                              "--work-dir {tmp}/afile/work: not a directory ({tmp}/afile is a "
                              "file)"),
    "report-dir under a file": (["--report-dir", "{tmp}/afile/reports"],
                                "--report-dir {tmp}/afile/reports: not a directory ({tmp}/afile "
                                "is a file)"),
    # issue 61: was "not writable (File exists)" / "0.0 MiB free on its filesystem"
    "report-dir is a file": (["--report-dir", "{tmp}/afile"],
                             "--report-dir {tmp}/afile: not a directory"),
    "report-dir under /proc": (["--report-dir", "/proc/harness-no-such/reports"],
                               "--report-dir /proc/harness-no-such/reports: not writable (No "
                               "such file or directory)"),
    "model-check-timeout 0": (["--model-check-timeout", "0"],
                              "--model-check-timeout 0: must be a number of seconds > 0"),
    "xfail-registry missing": (["--xfail-registry", "{tmp}/xfails.yml"],
                               "--xfail-registry {tmp}/xfails.yml: no such file (an xfail "
                               "registry is a YAML file"),
    "scenario is a directory": (["--scenario", "{tmp}/a"],
                                "--scenario {tmp}/a: a directory, not a scenario; name a scenario"
                                " in it with --scenario-dir {tmp}/a --scenario NAME (its "
                                "scenarios: q, s) or give a .yaml file"),
    "scenario file missing": (["--scenario", "nope.yaml"],
                              "--scenario nope.yaml: no such file; scenarios in "),
    "two files one name": (["--scenario", "{tmp}/a/s.yaml", "--scenario", "{tmp}/b/s.yaml"],
                           "--scenario: two scenario files are named 's': "),
    "several backends, none chosen": (["--scenario", "{tmp}/a/q.yaml", "--collect-only"],
                                      "--scenario q: no values for the default backend 'torch'; "
                                      "it runs on reference, te: pytest --scenario q --backend "
                                      "reference or pytest --scenario q --backend te"),
}


@pytest.mark.parametrize("args, message", OPTION_CASES.values(), ids=OPTION_CASES)
def test_bad_option_is_a_one_line_usage_error(pytester, args, message):
    _files(pytester)
    tmp = str(pytester.path)
    args = [a.replace("{tmp}", tmp) for a in args]
    names = [] if "--scenario" in args else ["--scenario", "s"]
    ret, out = _run(pytester, *names, *args)
    assert ret == pytest.ExitCode.USAGE_ERROR, out
    line = next((ln for ln in out.splitlines() if ln.startswith("ERROR: ")), out)
    assert message.replace("{tmp}", tmp) in line, out
    assert "Traceback" not in out and "INTERNALERROR" not in out, out


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a machine without CUDA")
def test_device_cuda_without_cuda_is_an_error(pytester):
    """Issue 61: was exit 0, every case skipped and a history written."""
    ret, out = _run(pytester, "--scenario", "s", "--device", "cuda",
                    "--report-dir", str(pytester.path / "reports"))
    assert ret == pytest.ExitCode.USAGE_ERROR, out
    assert ("ERROR: --device cuda: no CUDA device here (torch.cuda.is_available() is False); "
            "use --device cpu, or --device auto") in out
    assert not (pytester.path / "reports" / "history").exists()


def test_a_binary_scenario_file_is_named(pytester):
    """Issue 61: was "'utf-8' codec can't decode byte 0x89" without the file's name."""
    scen = pytester.path / "bin"
    scen.mkdir()
    (scen / "s.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    res = pytester.runpytest_inprocess("-p", "harness.plugin", "-p", "no:cacheprovider",
                                       "--scenario-dir", str(scen), "--scenario", "s")
    out = "\n".join(res.outlines + res.errlines)
    assert res.ret == pytest.ExitCode.USAGE_ERROR, out
    assert f"{scen / 's.yaml'}: not a text file (invalid start byte at byte 0)" in out, out


def test_world_size_without_cases_names_the_world_size(pytester):
    ret, out = _run(pytester, "--scenario", "s", "--world-size", "3", "--collect-only")
    assert ret == pytest.ExitCode.USAGE_ERROR, out
    assert "--world-size 3: no case of --scenario s (backend torch) has world size 3; their " \
           "world sizes: 2" in out, out
    assert "-k" not in out, out  # it was not -k / -m that dropped them


def test_good_options_pass(pytester):
    ret, out = _run(pytester, "--scenario", "s", "--case-timeout", "30", "--nnodes", "2",
                    "--rdzv-endpoint", "[::1]:29500", "--max-world-size", "2", "--collect-only")
    assert ret == 0, out


# --- a report dir that fails at the end: the summary still prints, the work dir goes -----------
FAKE_LAUNCHES = """
import harness.launch.launcher as launcher
from harness.launch.launcher import TaskResult

_real = launcher.Launcher.run_lane


def _fake(self, feed, world_size, env):
    # what a report dir that fills up or turns read-only mid-run looks like at the end
    (self.root.parents[2] / "history").write_text("a file where the history dir goes")
    while tasks := feed.wait(self._stop):
        feed.finished({t.name: TaskResult(t.name, "ok") for t in tasks})


def pytest_configure(config):
    launcher.Launcher.run_lane = _fake


def pytest_unconfigure(config):
    launcher.Launcher.run_lane = _real
"""


def test_report_dir_failure_at_the_end_keeps_summary_and_cleans_work(pytester):
    pytester.makeconftest(FAKE_LAUNCHES)
    work = pytester.path / "work"
    ret, out = _run(pytester, "--scenario", "s", "--work-dir", str(work),
                    "--report-dir", str(pytester.path / "reports"))
    assert ret == pytest.ExitCode.TESTS_FAILED, out  # the run's record is lost: not a pass
    assert "harness summary" in out and "outcomes: 1 passed" in out, out
    assert "reports NOT written to" in out and "Traceback" not in out, out
    assert work.is_dir() and list(work.iterdir()) == []  # the checkpoint dir was removed


@pytest.mark.parametrize("args, code", [(["--scenario", "s", "--collect-only"], 0),
                                        (["--scenario", "s", "--case-timeout", "0"], 4),
                                        (["--scenario", "nope"], 4)])
def test_the_collector_runs_again_however_the_run_ends(pytester, args, code):
    """The plugin pauses this process's garbage collector from its configure to the run loop
    (harness/speed/gc_pause.py); a collection, a usage error or an unknown scenario all
    leave it running, with what was alive at the end of the pause frozen."""
    import gc
    enabled = gc.isenabled()
    gc.enable()
    # what a plugin of the run sees once the run loop begins (the cases' lanes run from there)
    pytester.makeconftest("import gc\n\ndef pytest_runtestloop(session):\n"
                          "    open('loop.txt', 'w').write(str(gc.isenabled()))\n")
    try:
        ret, text = _run(pytester, *args)
        assert ret == code, text
        assert gc.isenabled()
        loop = pytester.path / "loop.txt"
        assert (loop.read_text() == "True") if code == 0 else not loop.exists()
        from harness.speed import gc_pause as collector
        assert not collector._paused
    finally:
        gc.unfreeze()
        (gc.enable if enabled else gc.disable)()
