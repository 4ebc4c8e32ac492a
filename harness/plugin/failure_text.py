"""What a failing case prints: its one-line summary, the failing rows, the units that did not
run and why, tracebacks, errors, hung ranks' stacks, logs, where its launches are and the
command that reruns it alone."""

from __future__ import annotations

import shlex
from pathlib import Path

from harness.launch.scheduler import CaseResult


class CaseFailed(AssertionError):
    """A case's checks failed or its tasks errored (the exception xfail entries expect)."""


class XfailMismatch(Exception):
    """An xfail-registered case failed, but not (only) the way its entries say it should."""


def one_line(res: CaseResult) -> str:
    if res.status != "ok":
        return f"{res.status}: " + (res.errors[0].strip().splitlines()[-1] if res.errors else "")
    bad = sorted({f"{r['check']}/{r['quantity']}" for r in res.failed_rows})
    return ("failed: " + ", ".join(bad)) if bad else "all checks passed"


class FailureFormatter:
    """Failure text and repro commands for the cases of one run: the backend and device they
    ran with, the scenario dir they came from and the dir their launches log to."""

    def __init__(self, root: Path, scenario_dir: Path, backend: str, device: str,
                 launches_dir: Path, paths: dict | None = None):
        self.root = root
        self.scenario_dir = scenario_dir
        self.backend = backend
        self.device = device
        self.launches_dir = launches_dir
        self.paths = paths or {}  # scenario name -> its file (a user's may lie anywhere)

    def repro(self, item) -> str:
        """The pytest command that reruns ``item``'s case alone (``item``: anything with a
        ``case``): its scenario by name from the scenario dir, or by its file's path."""
        name, path = item.case.scenario, self.paths.get(item.case.scenario)
        outside = path is not None and Path(path).parent.resolve() != self.scenario_dir.resolve()
        args = ["pytest", "--scenario", str(path) if outside else name, "--backend",
                self.backend, "--device", self.device, "-p", "no:randomly", "-k", item.case.id]
        if not outside and self.scenario_dir.resolve() != (self.root / "scenarios").resolve():
            args[3:3] = ["--scenario-dir", str(self.scenario_dir)]
        return shlex.join(args)

    def text(self, item, res: CaseResult) -> str:
        lines = [f"{item.case.id}: {one_line(res)}"]
        for r in res.failed_rows:
            if r["metric"] in ("max_abs", "violations", "exception"):
                lines.append(f"  [{r['phase']}] {r['check']}/{r['quantity']}: {r['detail']}")
        v = getattr(item, "verdict", None)
        by_reason: dict[str, list[str]] = {}
        for u, (st, why) in (v.coverage.items() if v else ()):
            if st == "not_run":
                by_reason.setdefault(why.removeprefix("not run: "), []).append(u)
        for why, units in by_reason.items():
            lines.append(f"  not run: {', '.join(units)} -- {why[:400]}")
        for r in res.failed_rows:
            if r.get("traceback"):
                lines.append(f"--- traceback: [{r['phase']}] {r['check']} (rank {r.get('rank', '?')})"
                             f" ---\n{r['traceback'].rstrip()}")
        for e in res.errors:
            lines.append(e.rstrip())
        if res.stacks:
            lines.append("Python stacks of the hung ranks:\n" + res.stacks.rstrip())
        if res.status != "ok":
            for who, text in res.logs.items():
                lines.append(f"--- log: {who} ---\n{text.rstrip()}")
        lines.append(f"launches: {', '.join(res.launches) or '-'} under {self.launches_dir}")
        lines.append(f"repro: {self.repro(item)}")
        return "\n".join(lines)
