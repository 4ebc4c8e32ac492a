"""Size limits that keep harness/ readable (issue 12): no module over 300 lines, no class over
150 lines. A module that outgrows them is split by concern, not granted an exception."""

import ast
from pathlib import Path

HARNESS = Path(__file__).resolve().parent.parent / "harness"
MAX_MODULE_LINES = 300
MAX_CLASS_LINES = 150
EXEMPT: set[str] = set()  # none: every module keeps the limits


def _modules():
    return [p for p in sorted(HARNESS.rglob("*.py"))
            if p.relative_to(HARNESS).as_posix() not in EXEMPT]


def test_the_modules_are_found():
    names = {p.relative_to(HARNESS).as_posix() for p in _modules()}
    assert {"plugin/hooks.py", "verdict/registry.py", "worker/main.py"} <= names
    assert not names & EXEMPT


def test_no_module_over_the_line_limit():
    big = {p.relative_to(HARNESS).as_posix(): n for p in _modules()
           if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {big}"


def test_no_class_over_the_line_limit():
    big = {}
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, ast.ClassDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_CLASS_LINES:
                    big[f"{p.relative_to(HARNESS).as_posix()}:{node.name}"] = n
    assert not big, f"classes over {MAX_CLASS_LINES} lines (split them by concern): {big}"
