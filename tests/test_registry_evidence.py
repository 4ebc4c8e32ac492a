"""Registry entries cite recorded runs that are no longer in the tree (results live in a
results store, docs/performance.md): each citation is an ``evidence`` item ``<commit>:<path>``
that git resolves, and every run an entry's text names has one."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.verdict import registry_file
from harness.verdict.registry import RegistryError

ROOT = Path(__file__).resolve().parent.parent
XFAILS = ROOT / "scenarios" / "xfails.yaml"
RUN_PATH = re.compile(r"reports/(?:gpu|bench)/[A-Za-z0-9_.+-]*[A-Za-z0-9_+]")


def _entries() -> list[dict]:
    return yaml.safe_load(XFAILS.read_text())["entries"]


def _texts(item) -> list[str]:
    """Every string of an entry but its evidence (reason, details, comments-as-values)."""
    if isinstance(item, dict):
        return [t for k, v in item.items() if k != "evidence" for t in _texts(v)]
    if isinstance(item, list):
        return [t for v in item for t in _texts(v)]
    return [item] if isinstance(item, str) else []


def _evidence(item: dict) -> list[str]:
    ev = item.get("evidence") or []
    return ev if isinstance(ev, list) else [ev]


def test_every_run_an_entry_names_has_evidence():
    cited = 0
    for n, item in enumerate(_entries(), start=1):
        paths = {m for t in _texts(item) for m in RUN_PATH.findall(t)}
        have = [e.split(":", 1)[1] for e in _evidence(item)]
        for p in paths:
            cited += 1
            assert any(h == p or h.startswith(p + "/") for h in have), (
                f"entry {n} names {p} but has no evidence <commit>:{p}")
    assert cited, "no entry names a recorded run: this test checks nothing any more"


def _git(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          timeout=60)


def test_every_evidence_resolves_in_git_history():
    items = sorted({e for item in _entries() for e in _evidence(item)})
    assert items, "no evidence in the registry"
    if shutil.which("git") is None or _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout: recorded runs cannot be resolved")
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("shallow clone: the commits holding recorded runs are not fetched "
                    "(CI uses a full clone)")
    missing = [e for e in items if _git("cat-file", "-e", e).returncode != 0]
    assert not missing, f"evidence not found in git history: {missing}"


def test_loader_reads_evidence_and_refuses_other_forms(tmp_path):
    reg = registry_file.load(XFAILS, {"recipe", "mesh", "module", "dcp", "reshard", "fixes",
                                      "optimizer", "mutation", "without", "fault"},
                             missing_ok=False)
    with_ev = [e for e in reg.entries if e.evidence]
    assert with_ev and all(":" in x for e in with_ev for x in e.evidence)
    base = ("entries:\n  - match: {scenario: s}\n    fails: {check: fp32_parity}\n"
            "    reason: r\n")
    ok = tmp_path / "ok.yaml"
    ok.write_text(base + "    evidence: abc1234:reports/gpu/run\n")
    assert registry_file.load(ok, set(), missing_ok=False).entries[0].evidence == (
        "abc1234:reports/gpu/run",)
    for bad in ("reports/gpu/run", "[abc1234]", "main:reports/gpu/run", "'abc1234:a b'"):
        p = tmp_path / "bad.yaml"
        p.write_text(base + f"    evidence: {bad}\n")
        with pytest.raises(RegistryError, match=r"bad.yaml: line 5: entries\[0\] \(entry 1\)"
                                                r"\.evidence: .* is not <commit>:<path>"):
            registry_file.load(p, set(), missing_ok=False)


CITATION = re.compile(r"\b([0-9a-f]{7,40}):(reports/(?:gpu|bench)[^\s`'\")\]<>]*)")


def test_every_commit_path_citation_in_the_tree_resolves():
    """Code, tests, CI and docs cite removed results as ``<commit>:reports/...`` (git show's
    form): each such citation must name a file or folder of that commit."""
    found = set()
    for top in ("harness", "tests", "ci", "docs", "scenarios"):
        for p in (ROOT / top).rglob("*"):
            if p.suffix in (".py", ".md", ".yaml", ".yml", ".sh") and p.is_file() and \
                    p != Path(__file__).resolve():  # this file's made-up commits
                for commit, path in CITATION.findall(p.read_text(errors="replace")):
                    found.add(f"{commit}:{path.rstrip('.,;:')}")
    assert len(found) >= 5, found
    if shutil.which("git") is None or _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout: citations cannot be resolved")
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("shallow clone: the cited commits are not fetched (CI uses a full clone)")
    missing = sorted(c for c in found if _git("cat-file", "-e", c).returncode != 0)
    assert not missing, f"citations that git cannot resolve: {missing}"
