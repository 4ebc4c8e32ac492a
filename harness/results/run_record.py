"""What a run leaves behind: each case's outcome and report dict, the launch records, the
history parquet / summary.csv / meta.json under the report dir, and the terminal summary
(outcomes, slowest cases, launch overhead, the fixes / mutants table)."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import Counter
from pathlib import Path

from harness.calibration.tolerances import UNJUDGED
from harness.launch import disk, interrupt
from harness.launch.tasks import task_wall
from harness.results import write as results
from harness.results.case_rows import case_rows, judged_rows
from harness.spec import catalog
from harness.verdict import mutation_score


class RunRecord:
    """``collected`` (case id -> (outcome, report dict)), ``launch_records`` (those the reports
    brought; ``pop_launch_records`` hands this process's new ones to the next report), and what
    writing them left: ``written`` (kind -> path), ``meta`` and ``report_error``."""

    def __init__(self, t0: float, report_dir: Path, write_reports: bool, worker_id: str | None):
        self.t0 = t0
        self.report_dir = report_dir
        self.write_reports = write_reports
        self.worker_id = worker_id
        self.collected: dict[str, tuple[str, dict]] = {}
        self.launch_records: list[dict] = []
        self._pending_records: list[dict] = []
        self.written: dict[str, Path] = {}
        self.meta: dict | None = None
        self.report_error = ""

    # --- launches ---------------------------------------------------------------------------
    def on_launch(self, rec) -> None:
        """Scheduler callback: a launch of this process ended -- every field of its record
        (``launch.tasks.LaunchRecord``) and the xdist worker that ran it."""
        self._pending_records.append({**dataclasses.asdict(rec), "worker": self.worker_id or ""})

    def pop_launch_records(self) -> list[dict]:
        out, self._pending_records = self._pending_records, []
        return out

    # --- outcomes ---------------------------------------------------------------------------
    def add_report(self, report) -> None:
        """A test report of a case item (``report.harness``: CaseItem.info)."""
        info = getattr(report, "harness", None)
        if info is None:
            return
        if report.when != "call":
            outcome = "skipped"
        else:  # the verdict's (CaseItem.runtest); pytest's own only where none was reached
            outcome = info.get("outcome") or report.outcome
        self.collected[info["case_id"]] = (outcome, info)
        self.launch_records += info.get("launch_records", [])

    # --- files ------------------------------------------------------------------------------
    def write(self, run_id: str, meta: dict, scenarios: list[str], registry_path) -> None:
        """The history parquet, summary.csv and meta.json (``meta``: results.run_meta)."""
        rows = [r for outcome, info in self.collected.values()
                for r in case_rows(info, outcome)]
        wall = time.time() - self.t0
        overhead = idle_wall(self.launch_records, wall)
        launch_wall = sum(r["wall_s"] for r in self.launch_records)
        meta.update(run_id=run_id, scenarios=scenarios, wall_s=wall,
                    launches=self.launch_records, launch_overhead_s=overhead,
                    launch_wall_s=launch_wall, argv=sys.argv,
                    registry=str(registry_path))
        self.meta = meta
        try:
            self.written = results.write_run(self.report_dir, run_id,
                                             results.frame(rows, meta), meta)
        except OSError as e:  # the summary still prints; the exit status says it failed
            full = disk.no_space(e)
            where = {"the report dir, --report-dir": self.report_dir}
            self.report_error = (f"reports NOT written: {disk.where(full, where)}" if full
                                 else f"reports NOT written to {self.report_dir}: {e}")

    # --- terminal ---------------------------------------------------------------------------
    def unjudged(self) -> list[tuple[str, str]]:
        """(case id, "check/quantity: why") of every comparison left unjudged: no tolerance
        could be derived for its configuration (a run with any is not green)."""
        out = []
        for cid, (_, info) in self.collected.items():
            seen = set()
            for r in info.get("rows") or ():
                k = (r.get("phase", ""), r["check"], r["quantity"])
                if r.get("outcome") == UNJUDGED and k not in seen:
                    seen.add(k)
                    why = r.get("detail", "").partition("unjudged: ")[2] or r.get("detail", "")
                    out.append((cid, f"{r['check']}/{r['quantity']}: {why[:300]}"))
        return out

    def terminal_summary(self, tr, backend_note: str) -> None:
        tr.section("harness summary")
        if backend_note:
            tr.write_line(backend_note)
        counts = Counter(o for o, _ in self.collected.values())
        tr.write_line("outcomes: " + ", ".join(f"{counts.get(k, 0)} {k}" for k in results.OUTCOMES)
                      + (f", {counts[interrupt.INTERRUPTED]} interrupted"
                         if counts[interrupt.INTERRUPTED] else ""))
        ran = [(info.get("seconds", 0.0), cid) for cid, (o, info) in self.collected.items()
               if o not in ("skipped",)]
        shared = [info for o, info in self.collected.values() if o != "skipped"
                  and info.get("device") == "cuda" and info.get("pg_backend") == "gloo"]
        if shared:
            most = max(int(i.get("ranks_per_gpu") or 0) for i in shared)
            tr.write_line(f"{len(shared)} case(s) ran with ranks sharing GPUs (gloo, up to "
                          f"{most} ranks a GPU; --gpu-share): not an NCCL run")
        reuse = sum(1 for o, info in self.collected.values() if o != "skipped" and any(
            r.get("quantity") == catalog.SHARED_TRAIN_PHASE for r in info.get("rows") or ()))
        if reuse:
            tr.write_line(f"{reuse} resharding case(s) loaded the checkpoint the same case "
                          f"without target saved, trained once (a train / "
                          f"{catalog.SHARED_TRAIN_PHASE} note names that case)")
        modes = Counter(r["quantity"] for o, info in self.collected.values() if o != "skipped"
                        for r in info.get("rows") or () if r.get("quantity") in (
                            catalog.MODE_GROUP, catalog.MODE_GROUP_OWN))
        if modes:
            tr.write_line(f"{modes[catalog.MODE_GROUP]} case(s) of a further DCP mode saved from "
                          f"their group's trained run (a train / {catalog.MODE_GROUP} note names "
                          f"the case that trained it); {modes[catalog.MODE_GROUP_OWN]} trained "
                          "their own after all")
        for secs, cid in sorted(ran, reverse=True)[:5]:
            tr.write_line(f"  slow: {secs:6.1f}s  {cid}")
        _launches(tr, self.launch_records, time.time() - self.t0)
        unjudged = self.unjudged()
        if unjudged:
            tr.write_line(f"unjudged: {len(unjudged)} quantities of "
                          f"{len({c for c, _ in unjudged})} case(s) have no tolerance for their "
                          f"configuration -- the run is not green:", red=True)
            for cid, what in unjudged[:10]:
                tr.write_line(f"  {cid} {what}", red=True)
        xf = [(cid, info) for cid, (o, info) in self.collected.items() if o == "xfailed"]
        if xf:
            tr.write_line(f"expected failures (xfail registry): {len(xf)}")
        _fixes_table(tr, mutation_score.table(switched_cases(self.collected)))
        for r in self.launch_records:
            for what in ("leaked", "gpu_held"):
                if r.get(what):
                    tr.write_line(f"launch {r['name']}: {what}: {'; '.join(r[what])}", red=True)
        for k, p in self.written.items():
            tr.write_line(f"{k}: {p}")
        if self.report_error:
            tr.write_line(self.report_error, red=True)


def idle_wall(recs: list[dict], wall: float) -> float:
    """Launch overhead: the seconds of ``wall`` in which no task ran in any launch (concurrent
    launches' start-ups overlap; summing each launch's own overhead gave "122% of wall")."""
    return max(0.0, wall - task_wall(recs))


def _launches(tr, recs: list[dict], wall: float) -> None:
    """The launches and their overhead (``idle_wall``)."""
    if recs:
        idle = idle_wall(recs, wall)
        per_world = Counter(r["world_size"] for r in recs)
        tr.write_line(f"torchrun launches: {len(recs)} ("
                      + ", ".join(f"{n} x world {w}" for w, n in sorted(per_world.items()))
                      + f"); launch overhead (no task running) {idle:.1f}s = "
                        f"{100 * idle / max(wall, 1e-9):.0f}% of {wall:.1f}s wall")
        retried = [r["name"] for r in recs if r.get("start_failed") == "retried"]
        if retried:
            tr.write_line(f"launches that failed before their first task, their tasks run "
                          f"again in a new launch: {', '.join(retried)} (logs: "
                          f"launches/<name>/torchrun.log)", yellow=True)


def _fixes_table(tr, table: list[dict]) -> None:
    """Each fix / mutant: the verdict, the checks that caught it, the outcomes; the score."""
    if not table:
        return
    tr.write_line("fixes / mutants: bug -> verdict (checks that caught it) -> outcomes")
    for row in table:
        what = f"{row['switch']}=no_{row['fix']}"
        tr.write_line(f"  {what:<38} {row['verdict']:<11} {row['caught_by'] or '-':<44} "
                      f"bug: {row['outcome']:<8} clean: {row['clean_outcome']}")
        if row["evidence"]:
            tr.write_line(f"      {row['evidence']}")
    for backend, sc in mutation_score.scores(table).items():
        tr.write_line(f"  mutation score ({backend}): {sc['caught']} caught / "
                      f"{sc['caught'] + sc['masked'] + sc['survived']} effective "
                      f"({sc['masked']} masked by known failures, {sc['survived']} survived); "
                      f"{sc['ineffective']} ineffective"
                      + "".join(f", {sc[k]} {k.replace('_', ' ')} (no check's catch)"
                                for k in ("crashed", "timed_out") if sc[k]))


def switched_cases(collected: dict) -> list[dict]:
    """The collected cases in the shape mutation_score.table reads."""
    return [dict(case_id=cid, scenario=info["scenario"], backend=info["backend"],
                 axes=dict(info["axes"]), outcome=outcome, rows=judged_rows(info),
                 status=info.get("status"))
            for cid, (outcome, info) in collected.items() if outcome != "skipped"]
