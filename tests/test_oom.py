"""A rank the kernel's OOM killer ended reads "killed by SIGKILL" and names the memory (issue 61:
before, a rank killed for memory read only "killed by SIGKILL"). The evidence is the memory
cgroup's oom_kill counter, here in a fake cgroup tree."""

from harness.launch import oom


def _tree(tmp_path, v2_count=None, v1_count=None):
    if v2_count is not None:
        d = tmp_path / "user.slice" / "run"
        d.mkdir(parents=True)
        (d / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 2\noom_kill {v2_count}\n")
    if v1_count is not None:
        d = tmp_path / "memory" / "docker" / "abc"
        d.mkdir(parents=True)
        (d / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\n"
                                              f"oom_kill {v1_count}\n")
    return tmp_path


def test_the_oom_kill_counter_of_this_cgroup(tmp_path):
    v2 = _tree(tmp_path / "a", v2_count=4)
    assert oom.oom_kills(v2, "0::/user.slice/run\n") == 4
    v1 = _tree(tmp_path / "b", v1_count=7)
    assert oom.oom_kills(v1, "4:memory:/docker/abc\n0::/\n") == 7
    assert oom.oom_kills(tmp_path / "none", "0::/x\n") is None


def test_a_sigkill_with_new_oom_kills_names_the_memory():
    text = oom.explain("rank 1 killed by SIGKILL, rank 0 exit code 1", before=2, now=3)
    assert text.startswith("rank 1 killed by SIGKILL, rank 0 exit code 1 -- out of memory: ")
    assert "OOM killer ended 1 process(es)" in text and "(oom_kill 2 -> 3)" in text


def test_no_memory_word_without_evidence():
    assert oom.explain("rank 1 killed by SIGKILL", before=2, now=2) == "rank 1 killed by SIGKILL"
    assert oom.explain("rank 1 killed by SIGKILL", before=None) == "rank 1 killed by SIGKILL"
    assert oom.explain("rank 1 exit code 3", before=0, now=5) == "rank 1 exit code 3"


def test_crash_account_uses_it(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from harness.launch import launch_dir
    (tmp_path / "torchrun.log").write_text(
        "[0]:\n  time      : 2026-11-28_10:00:00\n  host      : h\n  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : -9 (pid: 123)\n")
    monkeypatch.setattr(oom, "AT_START", 0)
    monkeypatch.setattr(oom, "oom_kills", lambda *a, **k: 1)
    monkeypatch.setattr(oom.explain, "__defaults__", (0, None))
    line = launch_dir.crash_account(tmp_path, SimpleNamespace(name="t", ckpt_dir="/c"))
    assert "killed by SIGKILL -- out of memory" in line, line
