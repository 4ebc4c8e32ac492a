"""Every repository path that harness/, tests/, scenarios/ and docs/ name exists: a file moved or
removed leaves no reference behind (a reader who follows one finds the file).

A path is a token that starts at a top-level folder of the repository (``harness/launch/gpu.py``,
``tests/report/``, ``scenarios/smoke.yaml``, ``docs/report.md``, ``ci/...``, ``examples/...``) or,
as the code's own comments write them, at a stage package of harness/ (``launch/gpu.py``, read
as ``harness/launch/gpu.py``). Not paths: a glob or template (``scenarios/*.yaml``,
``scenarios/{name}.yaml``, ``scenarios/<name>.yaml``) and a placeholder component in capitals
(``scenarios/NAME.yaml``). reports/ is where runs write, not a source tree: not checked here.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("harness", "tests", "scenarios", "docs")
TEXT = {".py", ".md", ".yaml", ".yml", ".j2", ".toml", ".sh", ".cfg", ".txt", ".css"}
TOP = ("harness", "tests", "scenarios", "docs", "ci", "examples")
STAGES = sorted(p.name for p in (ROOT / "harness").iterdir() if (p / "__init__.py").is_file())
TOKEN = re.compile(r"(?<![\w./\\-])((?:%s)/[\w./-]*)" % "|".join(TOP + tuple(STAGES)))
PLACEHOLDER = re.compile(r"(^|/)[A-Z]+(\.\w+)?$|(^|/)[A-Z]+/")
FILE_SUFFIXES = {s.lstrip(".") for s in TEXT} | {"json", "csv", "parquet", "html", "png"}


def _target(token: str) -> Path:
    """The file a token names: ``launch/gpu.py`` is harness/launch/gpu.py, and a module's
    attribute (``worker/tether.die_with``) is the module's file."""
    first = token.split("/", 1)[0]
    head, _, last = token.rpartition("/")
    stem, dot, suffix = last.partition(".")
    if dot and suffix not in FILE_SUFFIXES:
        token = f"{head}/{stem}.py"
    return ROOT / token if first in TOP else ROOT / "harness" / token


def named_paths(text: str) -> list[str]:
    """The path tokens of ``text`` that must exist (globs and placeholders left out)."""
    out = []
    for m in TOKEN.finditer(text):
        raw, after = m.group(1), text[m.end():m.end() + 1]
        token = raw.rstrip("./-")
        if after == "*" or (after in ("{", "<", "$") and raw[-1] in "/.") or "/" not in token:
            continue  # a glob or a template: scenarios/*.yaml, x/{device}, scenarios/<name>
        if PLACEHOLDER.search(token) or token.split("/", 1)[0] in STAGES and "." not in token:
            continue  # a placeholder; a bare 'launch/...' without a suffix is prose ("a/b")
        out.append(token)
    return out


def _files():
    for top in SCANNED:
        for f in sorted((ROOT / top).rglob("*")):
            if f.is_file() and f.suffix in TEXT and "__pycache__" not in f.parts:
                yield f


def test_every_named_repository_path_exists():
    missing = []
    for f in _files():
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for token in named_paths(line):
                if not (ROOT / token).exists() and not _target(token).exists():
                    missing.append(f"{f.relative_to(ROOT)}:{n}: {token}")
    assert not missing, "paths named but not in the repository:\n" + "\n".join(missing)


def test_what_counts_as_a_path():
    text = ("see harness/verdict/registry.py, launch/gpu.py and tests/report/; not "
            "scenarios/*.yaml, scenarios/{name}.yaml, harness/task-seconds/{device}, "
            "scenarios/NAME.yaml, "
            "https://x.org/docs/a.md, reports/bench, a harness.spec.catalog name, and/or")
    assert named_paths(text) == ["harness/verdict/registry.py", "launch/gpu.py", "tests/report"]
    assert _target("launch/gpu.py") == ROOT / "harness" / "launch" / "gpu.py"
    assert _target("worker/tether.die_with") == ROOT / "harness" / "worker" / "tether.py"
    gone = "harness" + "/tolerances.py"  # written apart: this file names no missing path
    assert named_paths(f"<code>{gone}</code>.") == [gone]
    assert not _target(gone).exists()  # what the test above would report
