"""Temporary directories of killed runs (issue 29): each run names its work dir and its
launches' TMPDIRs with its pid (``launch.scratch``); a later run removes those whose maker is
dead and says so in one line. (The SIGKILL end to end: test_interrupt.py; that the suite
itself leaves none: the session fixture in conftest.py.)"""

import os
import subprocess
import sys
import tempfile

from harness.launch import scratch


def _dead_pid() -> int:
    out = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return int(out)


def test_a_directory_names_the_pid_that_made_it(tmp_path):
    d = tempfile.mkdtemp(prefix=scratch.prefix("20261125T100037-14350-8b387ce5a6d7"),
                         dir=tmp_path)
    assert scratch.owner(d) == os.getpid()
    assert scratch.owner(tempfile.mkdtemp(prefix=scratch.prefix("L001"), dir=tmp_path)) \
        == os.getpid()
    assert scratch.owner(tmp_path / "harness-L001-e7n3x7un") is None  # unmarked (older runs)


def test_sweep_removes_only_what_dead_runs_left(tmp_path):
    dead = _dead_pid()
    gone = tmp_path / f"harness-L001-p{dead}-e7n3x7un"
    (gone / "pymp-6jz_0o3h").mkdir(parents=True)
    (gone / "pymp-6jz_0o3h" / "f").write_bytes(b"\0" * 2**20)
    kept = [tmp_path / f"harness-L001-p{os.getpid()}-abcdefgh",  # alive (this process)
            tmp_path / "harness-L001-p1-abcdefgh",  # alive (init)
            tmp_path / "harness-L002-l1z59xeh",  # unmarked: whose, nobody knows
            tmp_path / f"other-L001-p{dead}-abcdefgh"]  # not the harness's
    for d in kept:
        d.mkdir()
    (tmp_path / f"harness-L003-p{dead}-abcdefgh").write_text("a file, not a directory")
    line = scratch.sweep([tmp_path])
    assert line == (f"harness: removed 1 temporary directory left in {tmp_path} by runs that "
                    f"were killed (pids {dead}; 1.0 MiB)")
    assert not gone.exists() and all(d.is_dir() for d in kept)
    assert scratch.sweep([tmp_path]) == ""  # nothing more to say
