"""The house rules of harness/ (docs/architecture.md), read from the code's own imports with
``ast`` (every import, also those inside functions): one package per stage, imports only go
down the stages, no import circles, a handful of entry modules at the top."""

import ast
import re
from collections import defaultdict
from pathlib import Path

HARNESS = Path(__file__).resolve().parent.parent / "harness"
# bottom -> top: a package imports only packages at or below its own place
STAGES = ["spec", "calibration", "distributed", "speed", "reference", "checks", "backends",
          "worker", "launch", "verdict", "results", "report", "plugin"]
ENTRY_MODULES = {"__init__.py", "__main__.py"}  # python -m harness; the package itself
# what starts, feeds, watches and kills processes (and their signals)
PROCESS_MANAGEMENT = ["launch/launch.py", "launch/ending.py", "launch/launcher.py",
                      "launch/feed.py", "launch/scheduler.py", "launch/launch_dir.py",
                      "launch/procs.py", "launch/tethered.py", "launch/interrupt.py",
                      "launch/gpu.py", "worker/task_feed.py", "worker/tether.py",
                      "launch/rank_server.py", "launch/fork_agent.py",
                      "launch/server_preload.py", "worker/stager_fork.py"]
# not counted: launch/scratch.py (directories of killed runs swept by the next run: files, not
# processes), the task model (tasks, task_graph, case_result), placement, speed/ (the
# accelerations: what they start is counted where they start it, launch/ and worker/)
DOC = HARNESS.parent / "docs" / "architecture.md"


def process_management_max_lines() -> int:
    """The budget of the process-management modules, stated once: in docs/architecture.md."""
    m = re.search(r"process-management modules .*? stay within ([\d,]+) lines",
                  " ".join(DOC.read_text().split()))
    assert m, f"{DOC} states no process-management budget ('... stay within N lines')"
    return int(m.group(1).replace(",", ""))


def _module(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = HARNESS) -> dict[str, set[str]]:
    """module -> the harness modules it imports (relative imports resolved; ``from P import
    x`` counts as an import of P.x where that is a module)."""
    files = {_module(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for mod, path in files.items():
        base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                pkg = ".".join(base[:len(base) - node.level + 1] + [node.module or ""]) \
                    if node.level else node.module or ""
                pkg = pkg.rstrip(".")
                targets = [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in files else pkg
                           for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t.startswith("harness") and t != mod:
                    graph[mod].add(t)
    return {m: graph[m] for m in files}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a package to one above it in STAGES."""
    bad = []
    for mod, targets in graph.items():
        a = _stage(mod)
        for t in targets:
            b = _stage(t)
            if a in STAGES and b in STAGES and STAGES.index(b) > STAGES.index(a):
                bad.append(f"{mod} -> {t}")
    return sorted(bad)


def test_the_graph_sees_imports_and_the_rules_can_fail(tmp_path):
    """A made-up tree with a circle and an upward import: both are found."""
    pkg = tmp_path / "harness"
    for d in ("spec", "launch"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "spec" / "a.py").write_text("def f():\n    from harness.launch import b\n")
    (pkg / "launch" / "b.py").write_text("from ..spec import a\n")
    graph = import_graph(pkg)
    assert graph["harness.launch.b"] == {"harness.spec.a"}
    assert cycles(graph) == [["harness.launch.b", "harness.spec.a"]]
    assert upward_imports(graph) == ["harness.spec.a -> harness.launch.b"]


def test_no_import_circles():
    graph = import_graph()
    assert len(graph) > 100  # the whole package was read
    assert cycles(graph) == []


def test_imports_only_go_down_the_stages():
    assert upward_imports(import_graph()) == []


def test_harness_holds_stage_packages_and_entry_modules_only():
    top = {p.name for p in HARNESS.iterdir() if p.suffix == ".py"}
    assert top <= ENTRY_MODULES, top - ENTRY_MODULES
    packages = {p.name for p in HARNESS.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(STAGES), packages ^ set(STAGES)
    for name in STAGES:  # each says what it receives and hands on
        doc = ast.get_docstring(ast.parse((HARNESS / name / "__init__.py").read_text()))
        assert doc and len(doc.split()) >= 20, name


def test_process_management_stays_small():
    lines = {f: len((HARNESS / f).read_text().splitlines()) for f in PROCESS_MANAGEMENT}
    assert sum(lines.values()) <= process_management_max_lines(), lines
