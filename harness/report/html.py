"""One self-contained HTML report from a results history.

Plain HTML + CSS, figures as inline base64 PNG (matplotlib Agg, no pyplot state), no JavaScript
and no network access at view time: the file can be mailed, uploaded as a CI artifact or served
from GitHub Pages as is.

Sections: latest-run header, what changed since the previous run, drift alerts, outcome matrices
(recipe x mesh per module, per scenario / backend / hardware; every cell links to its cases),
drift plots (value over runs against tolerance, most at risk first), xfail ledger,
fix-verification table, timing (slowest cases, launch overhead), the runs of the history and the
case details the matrix cells link to.
"""

from __future__ import annotations

import base64
import fnmatch
import io
import json
import math
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from html import escape
from pathlib import Path

import numpy as np
import pandas as pd

from .. import registry as registry_mod
from . import drift as drift_mod
from .history import History

#: worst first: a cell takes the colour of its worst case
SEVERITY = ["failed", "xpassed", "xfailed", "skipped", "passed"]
SHORT = {"failed": "fail", "xpassed": "xpass", "xfailed": "xfail", "skipped": "skip",
         "passed": "pass"}
MEANING = {
    "failed": "a check failed (or the case crashed / timed out) and no xfail entry explains it",
    "xpassed": "matched an xfail entry but passed: the entry is stale, remove it (strict xfail: "
               "this fails the run)",
    "xfailed": "failed as an xfail entry of scenarios/xfails.yaml says it should (known bug)",
    "skipped": "not run here (e.g. needs more ranks, or a recipe this GPU cannot run)",
    "passed": "every check passed",
}
KNOWN_AXES = {"recipe", "mesh", "module", "dcp", "reshard", "fixes", "fault"}
MAX_PLOTS = 12
MAX_RISK_ROWS = 200
MAX_CHANGES = 60


def _outcome(o: str) -> str:
    return o if o in SEVERITY else "failed"


def worst(outcomes) -> str:
    found = {_outcome(o) for o in outcomes}
    for o in SEVERITY:
        if o in found:
            return o
    return "passed"


def _num(x) -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return escape(str(x))
    if math.isnan(x):
        return "–"
    if math.isinf(x):
        return "∞"
    if x == 0:
        return "0"
    return f"{x:.3g}"


def _secs(x) -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "–"
    return "–" if math.isnan(x) else f"{x:.1f} s"


def _date(s: str) -> str:
    """ISO date -> '2026-11-22 02:56 UTC' (as is when it does not parse)."""
    try:
        ts = pd.Timestamp(s)
    except (TypeError, ValueError):
        return str(s)
    if ts is pd.NaT:
        return str(s)
    ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
    return ts.strftime("%Y-%m-%d %H:%M UTC")


def _badge(outcome: str, text: str | None = None) -> str:
    o = _outcome(outcome) if outcome in SEVERITY or outcome else "skipped"
    return f'<span class="badge o-{o}">{escape(text or outcome)}</span>'


def _row_badge(outcome: str) -> str:
    cls = {"pass": "passed", "fail": "failed", "error": "failed", "info": "skipped"}.get(
        outcome, "skipped")
    return f'<span class="badge o-{cls}">{escape(outcome)}</span>'


class _Ids:
    """Stable, HTML-safe anchors for arbitrary keys."""

    def __init__(self, prefix: str):
        self.prefix, self.ids = prefix, {}

    def __call__(self, key) -> str:
        if key not in self.ids:
            self.ids[key] = f"{self.prefix}{len(self.ids) + 1}"
        return self.ids[key]


@dataclass
class Group:
    hw: str
    scenario: str
    backend: str
    runs: list[int]  # run_index of the runs containing this group, oldest first

    @property
    def label(self) -> str:
        device, gpu, _ = (self.hw.split("/") + ["", "", ""])[:3]
        where = device + (f" · {gpu}" if gpu and gpu != "-" else "")
        return f"{self.scenario} · {self.backend} · {where}"


def _groups(h: History) -> list[Group]:
    g = drift_mod.run_groups(h)
    out = [Group(r.hw, r.scenario, r.backend, list(r.runs)) for r in g.itertuples(index=False)]
    # most recent first, then by name
    return sorted(out, key=lambda x: (-x.runs[-1], x.scenario, x.hw))


def _case_rows(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["check"] == "case"]


def _group_rows(h: History, g: Group, run_index: int) -> pd.DataFrame:
    r = h.rows
    return r[(r["run_index"] == run_index) & (r["hw"] == g.hw) & (r["scenario"] == g.scenario)
             & (r["backend"] == g.backend)]


def _axes(s: str) -> dict:
    try:
        d = json.loads(s)
        return d if isinstance(d, dict) else {}
    except (TypeError, ValueError):
        return {}


def _coord(v) -> str:
    return str(v) if v not in (None, "") else "—"


# ------------------------------------------------------------------------------ figures ---
def _figure_png(series: pd.DataFrame, runs: pd.DataFrame, cfg: drift_mod.DriftConfig) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import LogLocator

    fig = Figure(figsize=(6.4, 2.6), dpi=96)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x = np.arange(len(series))
    v = series["value"].to_numpy(dtype=float)
    tol = series["tolerance"].to_numpy(dtype=float)
    floor = drift_mod.ZERO_FLOOR
    y = np.where(v > floor, v, floor)
    edges = np.arange(len(series) + 1) - 0.5
    if np.all(tol > 0):
        ax.stairs(tol, edges, color="#c62828", ls="--", lw=1.1, label="tolerance",
                  baseline=None)
        ax.stairs(cfg.fraction * tol, edges, color="#ef8f00", ls=":", lw=1.3,
                  label=f"{cfg.fraction:g} × tolerance", baseline=None)
    else:
        ax.plot([], [], " ", label="bitwise check (tolerance 0)")
    ax.plot(x, y, marker="o", ms=4, lw=1.3, color="#1f5fa8", label="value", zorder=3)
    zero = v <= floor
    if zero.any():
        ax.scatter(x[zero], y[zero], marker="v", s=30, facecolors="white", edgecolors="#555",
                   zorder=4, label=f"0 (drawn at {floor:g})")
    bad = series["row_outcome"].isin(["fail", "error"]).to_numpy()
    if bad.any():
        ax.scatter(x[bad], y[bad], marker="X", s=50, color="#c62828", zorder=5,
                   label="check failed")
    flag = series["flagged"].to_numpy(dtype=bool)
    if flag.any():
        ax.scatter(x[flag], y[flag], s=120, facecolors="none", edgecolors="#c62828", lw=1.6,
                   zorder=6, label="drift flagged")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, numticks=6))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0), numticks=6))
    dates = runs.set_index("run_index")["date_ts"]
    labels = []
    for ri in series["run_index"]:
        d = dates.get(ri)
        labels.append(d.strftime("%m-%d\n%H:%M") if isinstance(d, pd.Timestamp) and
                      d is not pd.NaT else f"#{ri}")
    step = max(1, math.ceil(len(x) / 7))
    ax.set_xticks(x[::step])
    ax.set_xticklabels(labels[::step], fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlim(-0.5, len(x) - 0.5)
    ax.margins(y=0.15)
    ax.grid(True, which="major", axis="y", color="#ddd", lw=0.6)
    ax.set_ylabel(series["metric"].iloc[0], fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.subplots_adjust(left=0.14, right=0.72, bottom=0.2, top=0.96)  # tight_layout is slow
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


# ------------------------------------------------------------------------------ sections --
class Report:
    def __init__(self, h: History, cfg: drift_mod.DriftConfig, registry_path: Path | None,
                 title: str = "Distributed correctness report"):
        self.h, self.cfg, self.title = h, cfg, title
        self.registry_path = registry_path
        self.groups = _groups(h)
        self.cell_id = _Ids("cell-")
        self.case_id = _Ids("case-")
        self.cells: list[tuple[str, str, pd.DataFrame, Group]] = []  # (anchor, title, cases, g)
        self.drift = drift_mod.detect(h, cfg)
        self._cache: dict[tuple, pd.DataFrame] = {}

    def _rows(self, g: Group, run_index: int) -> pd.DataFrame:
        key = (g.hw, g.scenario, g.backend, run_index)
        if key not in self._cache:
            self._cache[key] = _group_rows(self.h, g, run_index)
        return self._cache[key]

    # ---- header ----
    def header(self) -> str:
        h = self.h
        r = h.latest
        meta = r["meta"]
        cases = _case_rows(h.run_rows(r["run_id"]))
        counts = Counter(_outcome(o) for o in cases["case_outcome"])
        wall, over = r["wall_s"], r["launch_overhead_s"]
        share = (f" ({100 * over / wall:.0f}% of wall time spent starting torchrun / process "
                 f"groups)" if wall and not math.isnan(wall) and not math.isnan(over) else "")
        gpu = r["gpu_name"] or ("none" if r["device"] == "cpu" else "?")
        items = [
            ("run", f"<code>{escape(r['run_id'])}</code>"),
            ("date", escape(_date(r["date"]) if r["date"] else "?")),
            ("scenarios", escape(", ".join(r["scenarios"]) or "?")),
            ("git sha", f"<code>{escape(r['git_sha'] or 'unknown')}</code>"),
            ("torch", escape(str(meta.get("torch_build") or r["torch_version"] or "?"))),
            ("TransformerEngine", escape(r["te_version"] or "not installed")),
            ("device / GPU", escape(f"{r['device'] or '?'} / {gpu}")),
            ("backend", escape(r["backend"] or "?")),
            ("host", escape(r["hostname"] or "?")),
            ("wall time", _secs(wall)),
            ("launch overhead", _secs(over) + escape(share)),
            ("runs in history", f"{len(h.runs)} (from {escape(str(h.directory or '?'))})"),
        ]
        dl = "".join(f'<div class="kvi"><span class="k">{k}</span><span class="v">{v}</span>'
                     f'</div>' for k, v in items)
        badges = " ".join(_badge(o, f"{counts.get(o, 0)} {o}") for o in reversed(SEVERITY))
        n_drift = len(self.drift.flags)
        drift = (f' · <a href="#drift-alerts">{n_drift} drift alert(s)</a>' if n_drift else "")
        bad = counts.get("failed", 0) + counts.get("xpassed", 0) + n_drift
        verdict = "all good" if bad == 0 else "needs attention"
        cls = "ok" if verdict == "all good" else "bad"
        return (f'<section id="latest"><h2>Latest run</h2>'
                f'<p class="verdict {cls}">{len(cases)} cases: {badges}{drift} — <b>{verdict}</b>'
                f'</p>'
                f'<div class="kvgrid">{dl}</div></section>')

    def problems(self) -> str:
        if not self.h.problems:
            return ""
        items = "".join(f"<li><code>{escape(str(p))}</code>: {escape(why)}</li>"
                        for p, why in self.h.problems)
        return (f'<section class="warn" id="problems"><h2>Skipped history files '
                f'({len(self.h.problems)})</h2><p>These files in the history directory could not '
                f'be used and are left out of everything below:</p><ul>{items}</ul></section>')

    # ---- what changed ----
    def changes(self) -> str:
        parts = []
        for g in self.groups:
            cur = _case_rows(self._rows(g, g.runs[-1]))
            if len(g.runs) < 2:
                parts.append(f"<li><b>{escape(g.label)}</b>: first run in the history — nothing to "
                             f"compare with.</li>")
                continue
            prev = _case_rows(self._rows(g, g.runs[-2]))
            a = dict(zip(prev["case_id"], prev["case_outcome"]))
            b = dict(zip(cur["case_id"], cur["case_outcome"]))
            changed = [(c, a[c], b[c]) for c in b if c in a and a[c] != b[c]]
            new = [c for c in b if c not in a]
            gone = [c for c in a if c not in b]
            prev_id = self.h.runs.iloc[g.runs[-2]]["run_id"]
            if not (changed or new or gone):
                parts.append(f"<li><b>{escape(g.label)}</b>: no change since run "
                             f"<code>{escape(prev_id)}</code> ({len(b)} cases, same outcomes).</li>")
                continue
            sub = []
            for c, o1, o2 in changed[:MAX_CHANGES]:
                sub.append(f"<li>{self._case_link(c, g)}: {_badge(o1)} → {_badge(o2)}</li>")
            for c in new[:MAX_CHANGES]:
                sub.append(f"<li>new case {self._case_link(c, g)}: {_badge(b[c])}</li>")
            for c in gone[:MAX_CHANGES]:
                sub.append(f"<li>removed case <code>{escape(c)}</code> (was {_badge(a[c])})</li>")
            more = len(changed) + len(new) + len(gone) - len(sub)
            if more > 0:
                sub.append(f"<li>… and {more} more</li>")
            parts.append(f"<li><b>{escape(g.label)}</b> since run <code>{escape(prev_id)}</code>: "
                         f"{len(changed)} outcome change(s), {len(new)} new, {len(gone)} removed"
                         f"<ul>{''.join(sub)}</ul></li>")
        return (f'<section id="changes"><h2>What changed since the previous run</h2>'
                f'<p class="help">Per scenario, backend and hardware: the latest run against the '
                f'run before it.</p><ul>{"".join(parts)}</ul></section>')

    def _case_link(self, case: str, g: Group) -> str:
        key = (g.hw, g.backend, case)
        if key in self.case_id.ids:
            return f'<a href="#{self.case_id(key)}"><code>{escape(case)}</code></a>'
        return f"<code>{escape(case)}</code>"

    # ---- drift alerts ----
    def drift_alerts(self) -> str:
        d = self.drift
        notes = "".join(f"<li>{escape(n)}</li>" for n in d.notes)
        if d.flags.empty:
            body = ('<p class="verdict ok">No drift flagged in the latest runs.</p>')
        else:
            rows = []
            for r in d.flags.itertuples(index=False):
                g = Group(r.hw, r.scenario, r.backend, [])
                rows.append(f"<tr><td>{self._case_link(r.case_id, g)}</td>"
                            f"<td>{escape(f'{r.check}/{r.quantity}/{r.metric}')}</td>"
                            f"<td>{escape(r.hw)}</td><td>{_num(r.base_median)} ({r.base_n})</td>"
                            f"<td>{_num(r.value)}</td><td>{_num(r.tolerance)}</td>"
                            f"<td>{_num(r.risk)}</td><td>{escape(r.reason)}</td></tr>")
            body = (f'<p class="verdict bad">{len(d.flags)} series drifted.</p>'
                    f'<table class="data"><tr><th>case</th><th>check/quantity/metric</th>'
                    f'<th>hardware</th><th>baseline median (runs)</th><th>latest</th>'
                    f'<th>tolerance</th><th>latest / tolerance</th><th>why</th></tr>'
                    f'{"".join(rows)}</table>')
        return (f'<section id="drift-alerts"><h2>Drift alerts</h2><p class="help">'
                f'{escape(self.cfg.describe())}. Same rule as <code>python -m harness drift'
                f'</code>; see <a href="#drift">drift plots</a> for the history of each series.'
                f'</p>{body}<ul class="notes">{notes}</ul></section>')

    # ---- outcome matrices ----
    def legend(self) -> str:
        items = "".join(f'<div>{_badge(o, SHORT[o])} {escape(MEANING[o])}</div>'
                        for o in SEVERITY)
        return (f'<div class="legend"><b>Cell colour = the worst outcome among its cases, worst '
                f'first:</b>{items}<div><span class="badge o-none">–</span> no case with these '
                f'coordinates</div></div>')

    def matrices(self) -> str:
        out = [f'<section id="matrix"><h2>Outcome matrix</h2><p class="help">One table per '
               f'module: recipe (rows) × device mesh (columns), for the latest run of each '
               f'scenario on each backend and hardware. A cell counts the cases with those '
               f'coordinates (the other axes — DCP mode, resharding, fixes … — vary inside the '
               f'cell); click it for the cases, their checks and the command that reproduces '
               f'each one.</p>{self.legend()}']
        for g in self.groups:
            run = self.h.runs.iloc[g.runs[-1]]
            rows = self._rows(g, g.runs[-1])
            cases = _case_rows(rows)
            counts = Counter(_outcome(o) for o in cases["case_outcome"])
            summary = ", ".join(f"{counts[o]} {o}" for o in reversed(SEVERITY) if counts.get(o))
            out.append(f'<h3>{escape(g.label)}</h3><p class="sub">run <code>'
                       f'{escape(run["run_id"])}</code> · {escape(_date(run["date"]))} · '
                       f'{len(cases)} cases: {escape(summary)}</p><div class="mods">')
            recipes = list(dict.fromkeys(cases["recipe"].map(_coord)))
            meshes = list(dict.fromkeys(cases["mesh"].map(_coord)))
            for module in dict.fromkeys(cases["module"].map(_coord)):
                mc = cases[cases["module"].map(_coord) == module]
                head = "".join(f"<th>{escape(m)}</th>" for m in meshes)
                trs = []
                for rec in recipes:
                    tds = []
                    for mesh in meshes:
                        sel = mc[(mc["recipe"].map(_coord) == rec) & (mc["mesh"].map(_coord) == mesh)]
                        tds.append(self._cell(g, module, rec, mesh, sel, rows))
                    trs.append(f"<tr><th>{escape(rec)}</th>{''.join(tds)}</tr>")
                out.append(f'<table class="matrix"><caption>{escape(module)}</caption>'
                           f'<tr><th class="corner">recipe \\ mesh</th>{head}</tr>'
                           f'{"".join(trs)}</table>')
            out.append("</div>")
        out.append("</section>")
        return "".join(out)

    def _cell(self, g: Group, module: str, rec: str, mesh: str, sel: pd.DataFrame,
              rows: pd.DataFrame) -> str:
        if sel.empty:
            return '<td class="o-none">–</td>'
        counts = Counter(_outcome(o) for o in sel["case_outcome"])
        w = worst(counts)
        anchor = self.cell_id((g.hw, g.scenario, g.backend, module, rec, mesh))
        title = f"{g.label}: {module}, {rec}, {mesh}"
        self.cells.append((anchor, title, sel, g))
        for c in sel["case_id"]:
            self.case_id((g.hw, g.backend, c))
        text = "<br>".join(f"{counts[o]} {SHORT[o]}" for o in SEVERITY if counts.get(o))
        tip = "; ".join(f"{c}: {o}" for c, o in zip(sel["case_id"], sel["case_outcome"]))
        return (f'<td class="cell o-{w}"><a href="#{anchor}" title="{escape(tip)}">{text}</a>'
                f'</td>')

    # ---- case details ----
    def details(self) -> str:
        out = ['<section id="details"><h2>Case details</h2><p class="help">One block per matrix '
               'cell. For each case: outcome, the checks that failed (value against tolerance), '
               'the xfail entry or skip reason, and the command that reruns just this case. '
               '“all rows” lists every check value.</p>']
        by_case: dict[tuple, dict[str, pd.DataFrame]] = {}
        for anchor, title, sel, g in self.cells:
            gk = (g.hw, g.scenario, g.backend)
            if gk not in by_case:
                rows = self._rows(g, g.runs[-1])
                by_case[gk] = dict(list(rows.groupby("case_id", sort=False)))
            items = []
            for case in sel.itertuples(index=False):
                items.append(self._case(case, by_case[gk][case.case_id], g))
            out.append(f'<div class="cellbox" id="{anchor}"><h3>{escape(title)} '
                       f'<a class="up" href="#matrix">↑ matrix</a></h3>{"".join(items)}</div>')
        out.append("</section>")
        return "".join(out)

    def _case(self, case, rows: pd.DataFrame, g: Group) -> str:
        anchor = self.case_id((g.hw, g.backend, case.case_id))
        ax = _axes(case.axes)
        inner = {k: v for k, v in ax.items() if k not in ("recipe", "mesh", "module")}
        coords = ", ".join(f"{k}={v}" for k, v in inner.items())
        checks = rows[~rows["check"].isin(["case", "trace"])]
        bad = checks[checks["row_outcome"].isin(["fail", "error"])]
        lines = [f'<div class="case" id="{anchor}"><div class="casehead">'
                 f'{_badge(case.case_outcome)} <code>{escape(case.case_id)}</code> '
                 f'<span class="sub">{escape(coords)} · {_secs(case.duration_s)}'
                 f'{" · status " + escape(case.case_status) if case.case_status not in ("", "ok") else ""}'
                 f'</span></div>']
        if case.detail:
            lines.append(f'<div class="summary">{escape(case.detail)}</div>')
        if len(bad):
            trs = "".join(
                f"<tr><td>{escape(r.check)}</td><td>{escape(r.quantity)}</td>"
                f"<td>{escape(r.metric)}</td><td>{_num(r.value)}</td><td>{_num(r.tolerance)}</td>"
                f"<td>{_row_badge(r.row_outcome)}</td><td class='det'>{escape(r.detail)}</td></tr>"
                for r in bad.itertuples(index=False))
            lines.append(f'<table class="data"><caption>failed checks</caption><tr><th>check</th>'
                         f'<th>quantity</th><th>metric</th><th>value</th><th>tolerance</th>'
                         f'<th></th><th>detail</th></tr>{trs}</table>')
        entry = case.xfail_entry
        if entry is not pd.NA and entry is not None and not (isinstance(entry, float)
                                                              and math.isnan(entry)):
            lines.append(f'<div class="kvline"><b>xfail entry {int(entry)}</b>: '
                         f'{escape(case.xfail_reason)} (<a href="#xfail-{int(entry)}">ledger</a>)'
                         f'</div>')
        elif case.xfail_reason:
            lines.append(f'<div class="kvline"><b>xfail</b>: {escape(case.xfail_reason)}</div>')
        if case.skip_reason:
            lines.append(f'<div class="kvline"><b>skip reason</b>: {escape(case.skip_reason)}</div>')
        tr = rows[(rows["check"] == "trace")]
        if len(tr):
            for (phase, qty), t in tr.groupby(["phase", "quantity"], sort=False):
                vals = ", ".join(f"{v:.6g}" for v in t["value"])
                lines.append(f'<div class="kvline"><b>{escape(qty)} per step</b> '
                             f'({escape(phase or "train")}): {vals}</div>')
        if case.repro:
            lines.append(f'<div class="kvline"><b>repro</b>: <code class="cmd">'
                         f'{escape(case.repro)}</code></div>')
        if len(checks):
            trs = "".join(
                f"<tr><td>{escape(r.phase)}</td><td>{escape(r.check)}</td>"
                f"<td>{escape(r.quantity)}</td><td>{escape(r.metric)}</td><td>{_num(r.value)}</td>"
                f"<td>{_num(r.tolerance)}</td><td>{_row_badge(r.row_outcome)}</td></tr>"
                for r in checks.itertuples(index=False))
            lines.append(f'<details><summary>all rows ({len(checks)})</summary>'
                         f'<table class="data small"><tr><th>phase</th><th>check</th>'
                         f'<th>quantity</th><th>metric</th><th>value</th><th>tolerance</th>'
                         f'<th></th></tr>{trs}</table></details>')
        lines.append("</div>")
        return "".join(lines)

    # ---- drift plots ----
    def drift_plots(self) -> str:
        pts = drift_mod.points(self.h.rows, self.cfg, bitwise_failures=True)
        intro = (f'<section id="drift"><h2>Drift: value over runs against tolerance</h2>'
                 f'<p class="help">Each series is one (case, check, quantity, metric) on one '
                 f'hardware. Risk = latest value / tolerance; series most at risk first. Log '
                 f'scale; the dashed red line is the tolerance, the dotted orange line '
                 f'{self.cfg.fraction:g} × tolerance (the drift threshold). Values of 0 are drawn '
                 f'at {drift_mod.ZERO_FLOOR:g} (hollow triangle). Bitwise checks (tolerance 0) '
                 f'appear only if they ever failed.</p>')
        if pts.empty:
            return intro + "<p>No toleranced metrics in the history.</p></section>"
        last = pts.groupby(drift_mod.GROUP_KEY, sort=False).tail(1).copy()
        latest_idx = {(g.hw, g.scenario, g.backend): g.runs[-1] for g in self.groups}
        last["current"] = [latest_idx.get((hw, s, b)) == ri for hw, s, b, ri in
                           zip(last["hw"], last["scenario"], last["backend"], last["run_index"])]
        npts = pts.groupby(drift_mod.GROUP_KEY, sort=False).size().rename("n_points")
        last = last.join(npts, on=drift_mod.GROUP_KEY)
        last = last.sort_values(["current", "risk", "flagged", "n_points"],
                                ascending=[False, False, False, False], kind="stable")
        # series with the very same points (cases that differ only in axes that do not change
        # the numbers, e.g. the DCP mode for fp32_parity) share one plot
        sig = pts.assign(_p=pts["run_index"].astype(str) + ":" + pts["value"].map(repr) + ":"
                         + pts["tolerance"].map(repr) + ":" + pts["row_outcome"])
        sig = sig.groupby(drift_mod.GROUP_KEY, sort=False)["_p"].agg("|".join)
        last = last.join(sig.rename("sig"), on=drift_mod.GROUP_KEY)
        twin_key = ["hw", "scenario", "backend", "check", "quantity", "metric", "sig"]
        twins = last.groupby(twin_key, sort=False)["case_id"].agg(list)
        last = last.drop_duplicates(twin_key).join(twins.rename("twins"), on=twin_key)
        multi_hw = last["hw"].nunique() > 1
        figs = []
        grouped = dict(list(pts.groupby(drift_mod.GROUP_KEY, sort=False)))
        for r in last.head(MAX_PLOTS).itertuples(index=False):
            key = tuple(getattr(r, k) for k in drift_mod.GROUP_KEY)
            s = grouped[key].sort_values("run_index")
            src = _figure_png(s, self.h.runs, self.cfg)
            g = Group(r.hw, r.scenario, r.backend, [])
            risk = ("bitwise check failed" if r.tolerance == 0
                    else f"{r.risk:.3g}× tolerance: failing" if r.risk > 1
                    else f"{100 * r.risk:.3g}% of tolerance")
            flag = (f' <span class="badge o-failed">drift: {escape(r.reason)}</span>'
                    if r.flagged else "")
            gone = "" if r.current else ' <span class="badge o-skipped">not in latest run</span>'
            others = r.twins[1:]
            same = ""
            if others:
                links = ", ".join(self._case_link(c, g) for c in others)
                same = (f'<details><summary>+ {len(others)} more case(s) with identical values'
                        f'</summary>{links}</details>')
            figs.append(
                f'<figure><img alt="{escape(f"{r.case_id} {r.check}/{r.quantity}/{r.metric}")}" '
                f'src="{src}"><figcaption>{self._case_link(r.case_id, g)}<br>'
                f'<b>{escape(f"{r.check} / {r.quantity} / {r.metric}")}</b>'
                f'{" · " + escape(r.hw) if multi_hw else ""} · latest {_num(r.value)}, tolerance '
                f'{_num(r.tolerance)} ({risk}) · {len(s)} run(s){flag}{gone}{same}'
                f'</figcaption></figure>')
        rest = last.iloc[MAX_PLOTS:]
        table = ""
        if len(rest):
            shown = rest.head(MAX_RISK_ROWS)
            trs = "".join(
                f"<tr><td>{self._case_link(r.case_id, Group(r.hw, r.scenario, r.backend, []))}</td>"
                f"<td>{escape(f'{r.check}/{r.quantity}/{r.metric}')}</td>"
                f"<td>{_num(r.base_median)}</td><td>{_num(r.value)}</td>"
                f"<td>{_num(r.tolerance)}</td><td>{_num(r.risk)}</td>"
                f"<td>{len(r.twins) - 1 or ''}</td><td>{escape(r.reason) if r.flagged else ''}"
                f"{'' if r.current else ' (not in latest run)'}</td></tr>"
                for r in shown.itertuples(index=False))
            more = (f"<p class='sub'>… and {len(rest) - len(shown)} more series with lower "
                    f"risk.</p>" if len(rest) > len(shown) else "")
            table = (f'<details><summary>{len(rest)} more series (no plot), most at risk first'
                     f'</summary><table class="data small"><tr><th>case</th>'
                     f'<th>check/quantity/metric</th><th>baseline median</th><th>latest</th>'
                     f'<th>tolerance</th><th>latest / tolerance</th><th>+ cases with identical values</th>'
                     f'<th>drift</th></tr>{trs}'
                     f'</table>{more}</details>')
        return intro + f'<div class="figs">{"".join(figs)}</div>{table}</section>'

    # ---- xfail ledger ----
    def ledger(self) -> str:
        intro = ('<section id="xfails"><h2>Xfail ledger</h2><p class="help">Every entry of the '
                 'known-failure registry: how often it matched a case, whether the case failed as '
                 'the entry says, and which entries are stale (never matched, or the case passes '
                 'now — remove those).</p>')
        path = self.registry_path
        entries, err = [], ""
        if path is None:
            err = "no registry file given or recorded in the runs"
        elif not Path(path).is_file():
            err = f"registry {path} not found"
        else:
            axes = set(KNOWN_AXES)
            for a in self.h.rows.loc[self.h.rows["check"] == "case", "axes"].unique():
                axes |= set(_axes(a))
            try:
                entries = registry_mod.load(path, axes).entries
            except registry_mod.RegistryError as e:
                err = f"cannot read the registry: {e}"
        cases = _case_rows(self.h.rows)
        matched = cases[cases["xfail_entry"].notna()]
        scenario_latest = {}
        for g in self.groups:
            scenario_latest.setdefault(g.scenario, set()).add(g.runs[-1])
        trs = []
        numbers = [e.number for e in entries]
        combos = set(zip(cases["scenario"], cases["backend"], cases["device"]))
        for e in entries:
            exercised = any(all(any(fnmatch.fnmatchcase(v, p) for p in e.match.get(k, ["*"]))
                                for k, v in zip(("scenario", "backend", "device"), c))
                            for c in combos)
            trs.append(self._ledger_row(e.number, e.line, e.match, e.reason, e.link, matched,
                                        scenario_latest, exercised=exercised))
        # entries seen in the history that the registry no longer has
        for n in sorted(set(int(x) for x in matched["xfail_entry"]) - set(numbers)):
            m = matched[matched["xfail_entry"] == n]
            trs.append(self._ledger_row(n, 0, None, m["xfail_reason"].iloc[-1], "", matched,
                                        scenario_latest, gone=True))
        head = (f'<p class="sub">registry: <code>{escape(str(path))}</code>'
                f'{" — " + escape(err) if err else ""}</p>')
        if not trs:
            return intro + head + "<p>The registry has no entries and no case of the history " \
                                  "matched one.</p></section>"
        return (intro + head + '<table class="data"><tr><th>entry</th><th>match</th>'
                '<th>reason</th><th>matched (latest / all runs)</th><th>outcomes when matched</th>'
                f'<th>status</th></tr>{"".join(trs)}</table></section>')

    def _ledger_row(self, n, line, match, reason, link, matched, scenario_latest, gone=False,
                    exercised=True):
        m = matched[matched["xfail_entry"] == n]
        outs = Counter(m["case_outcome"])
        latest_m = m[np.array([ri in scenario_latest.get(s, ()) for s, ri in
                               zip(m["scenario"], m["run_index"])], dtype=bool)]
        lo = Counter(latest_m["case_outcome"])
        if m.empty and not exercised:
            where = ", ".join(f"{k} {'|'.join(match[k])}" for k in ("scenario", "backend", "device")
                              if match and k in match)
            status, cls = f"not exercised: no run of {where or 'its scenario'} in the history", \
                "skipped"
        elif m.empty:
            status, cls = "stale: never matched a case", "xpassed"
        elif latest_m.empty:
            status, cls = "stale: did not match in the latest run of its scenario", "xpassed"
        elif lo.get("xpassed"):
            status, cls = f"stale: passes now ({lo['xpassed']} case(s)) — remove the entry", "xpassed"
        elif lo.get("failed"):
            status, cls = "fails, but not the way the entry says", "failed"
        else:
            status, cls = "ok: failed as expected", "xfailed"
        if gone:
            status += " (entry no longer in the registry)"
        mt = (", ".join(f"{k}={'|'.join(v)}" for k, v in match.items()) if match
              else "(unknown)")
        ln = f' <span class="sub">line {line}</span>' if line else ""
        lk = f' <a href="{escape(link)}">{escape(link)}</a>' if link.startswith(("http://", "https://")) \
            else (f" {escape(link)}" if link else "")
        out_s = ", ".join(f"{v} {k}" for k, v in outs.items()) or "–"
        return (f'<tr id="xfail-{n}"><td>{n}{ln}</td><td><code>{escape(mt)}</code></td>'
                f'<td>{escape(reason)}{lk}</td><td>{len(latest_m)} / {len(m)} '
                f'({m["run_id"].nunique()} run(s))</td><td>{escape(out_s)}</td>'
                f'<td class="st">{_badge(cls, status)}</td></tr>')

    # ---- fix verification ----
    def fixes(self) -> str:
        blocks = []
        for g in self.groups:
            rows = self._rows(g, g.runs[-1])
            cases = _case_rows(rows).copy()
            ax = [_axes(a) for a in cases["axes"]]
            if not any("fixes" in a for a in ax):
                continue
            cases["_ax"] = ax
            by_coords = {}
            for c, a, o in zip(cases["case_id"], ax, cases["case_outcome"]):
                if "fixes" in a:
                    rest = tuple(sorted((k, str(v)) for k, v in a.items() if k != "fixes"))
                    by_coords[(rest, str(a["fixes"]))] = (c, o)
            trs = []
            for (rest, fx), (c, o) in sorted(by_coords.items(), key=lambda kv: (kv[0][1], kv[0][0])):
                if not fx.startswith("no_"):
                    continue
                fix = fx[3:]
                on = by_coords.get((rest, "all"))
                bad = rows[(rows["case_id"] == c) & rows["row_outcome"].isin(["fail", "error"])
                           & ~rows["check"].isin(["case", "trace"])]
                failed = "<br>".join(
                    f"<b>{escape(r.check)}</b>/{escape(r.quantity)}: {escape(r.detail[:160])}"
                    for r in bad.drop_duplicates(["check", "quantity"]).itertuples(index=False)
                ) or "–"
                if on is None:
                    verdict, cls = "no matching fixes=all case", "skipped"
                elif o == "xfailed" and on[1] == "passed":
                    verdict, cls = "verified: fails without the fix, passes with it", "passed"
                elif o == "failed" and on[1] == "passed":
                    verdict, cls = ("fails without the fix, but unexpectedly: no xfail entry "
                                    "(or not the declared failure)"), "failed"
                elif o == "passed":
                    verdict, cls = "not verified: passes without the fix", "failed"
                elif o == "skipped" or on[1] == "skipped":
                    verdict, cls = "skipped", "skipped"
                else:
                    verdict, cls = f"fix does not work: with it the case {on[1]}", "failed"
                where = ", ".join(f"{k}={v}" for k, v in rest)
                on_cell = (f"{self._case_link(on[0], g)} {_badge(on[1])}" if on else "–")
                trs.append(f"<tr><td><b>{escape(fix)}</b></td><td class='sub'>{escape(where)}"
                           f"</td><td>{self._case_link(c, g)} {_badge(o)}</td><td>{failed}</td>"
                           f"<td>{on_cell}</td><td class='st'>{_badge(cls, verdict)}</td></tr>")
            if trs:
                blocks.append(f'<h3>{escape(g.label)}</h3><table class="data"><tr><th>fix</th>'
                              f'<th>coordinates</th><th>fix off (expected xfail)</th>'
                              f'<th>checks that failed with the fix off</th>'
                              f'<th>fix on (expected pass)</th><th>verdict</th></tr>'
                              f'{"".join(trs)}</table>')
        if not blocks:
            return ""
        return ('<section id="fixes"><h2>Fix verification</h2><p class="help">Each fix is turned '
                'off on its own (<code>fixes=no_&lt;fix&gt;</code>): the case must fail, with the '
                'checks listed, and pass with every fix on (<code>fixes=all</code>).</p>'
                + "".join(blocks) + "</section>")

    # ---- timing ----
    def timing(self) -> str:
        r = self.h.latest
        cases = _case_rows(self.h.run_rows(r["run_id"]))
        ran = cases[cases["case_outcome"] != "skipped"].sort_values("duration_s", ascending=False)
        trs = "".join(f"<tr><td>{_secs(c.duration_s)}</td><td>{self._case_link(c.case_id, Group(c.hw, c.scenario, c.backend, []))}"
                      f"</td><td>{_badge(c.case_outcome)}</td></tr>"
                      for c in ran.head(15).itertuples(index=False))
        launches = r["meta"].get("launches") or []
        lt = ""
        if launches:
            ltr = "".join(
                f"<tr><td>{escape(str(l.get('name', '')))}</td><td>{escape(str(l.get('worker') or '–'))}</td>"
                f"<td>{escape(str(l.get('world_size', '')))}</td><td>{escape(str(l.get('tasks', '')))}</td>"
                f"<td>{_secs(l.get('wall_s'))}</td><td>{_secs(l.get('overhead_s'))}</td>"
                f"<td>{escape(str(l.get('returncode', '')))}{' (timed out)' if l.get('timed_out') else ''}</td></tr>"
                for l in launches if isinstance(l, dict))
            lt = (f'<table class="data"><caption>torchrun launches of the latest run</caption>'
                  f'<tr><th>launch</th><th>xdist worker</th><th>world size</th><th>tasks</th>'
                  f'<th>wall</th><th>overhead (start-up, not tasks)</th><th>exit code</th></tr>'
                  f'{ltr}</table>')
        return (f'<section id="timing"><h2>Timing</h2><p class="help">Slowest cases of the latest '
                f'run and its torchrun launches. A launch runs many cases in one process group; '
                f'its overhead is the time spent starting processes and process groups rather '
                f'than running cases.</p><div class="mods"><table class="data"><caption>slowest '
                f'cases</caption><tr><th>duration</th><th>case</th><th></th></tr>{trs}</table>'
                f'{lt}</div></section>')

    def runs_table(self) -> str:
        trs = []
        cases = _case_rows(self.h.rows)
        per_run = {rid: Counter(_outcome(o) for o in g) for rid, g in
                   cases.groupby("run_id", sort=False)["case_outcome"]}
        for r in self.h.runs.iloc[::-1].itertuples(index=False):
            cnt = per_run.get(r.run_id, Counter())
            share = (f"{100 * r.launch_overhead_s / r.wall_s:.0f}%" if r.wall_s and
                     not math.isnan(r.wall_s) and not math.isnan(r.launch_overhead_s) else "–")
            trs.append(
                f"<tr><td><code>{escape(r.run_id)}</code></td><td>{escape(_date(r.date))}</td>"
                f"<td>{escape(', '.join(r.scenarios))}</td><td>{escape(r.hw)}</td>"
                f"<td><code>{escape(r.git_sha or '–')}</code></td><td>{escape(r.torch_version)}</td>"
                f"<td>{' '.join(_badge(o, f'{cnt[o]} {SHORT[o]}') for o in SEVERITY if cnt.get(o))}"
                f"</td><td>{_secs(r.wall_s)}</td><td>{share}</td><td class='sub'>"
                f"{escape(Path(str(r.file)).name)}</td></tr>")
        return (f'<section id="runs"><h2>Runs in the history ({len(self.h.runs)})</h2>'
                f'<table class="data small"><tr><th>run</th><th>date</th><th>scenarios</th>'
                f'<th>hardware (device/GPU/backend)</th><th>git sha</th><th>torch</th>'
                f'<th>outcomes</th><th>wall</th><th>launch overhead</th><th>file</th></tr>'
                f'{"".join(trs)}</table></section>')

    def howto(self) -> str:
        return ('<details class="howto"><summary>How to read this report</summary><ul>'
                '<li>Each <b>case</b> is one combination of a scenario’s axes (recipe, mesh, '
                'module, DCP mode, resharding …), run as a real multi-process job. Its checks '
                'compare against an FP32 single-process reference (<i>fp32_parity</i>, within a '
                'tolerance) or bit for bit (<i>dcp_roundtrip</i>, <i>async_equivalence</i>, '
                '<i>reshard</i> state).</li>'
                '<li><b>Outcome matrix</b>: start here. Red or purple cells need attention; '
                'click a cell for its cases and the command that reproduces each one.</li>'
                '<li><b>Drift</b>: a check can pass today and still creep towards its tolerance. '
                'The plots show each metric over the runs against its tolerance; the alerts list '
                'what jumped or crossed the threshold in the latest run.</li>'
                '<li><b>Xfail ledger</b>: known failures (<code>scenarios/xfails.yaml</code>) '
                'and whether they still fail the way they should.</li>'
                '<li>Details in <code>docs/report.md</code>.</li></ul></details>')

    def render(self) -> str:
        matrix = self.matrices()  # first: registers the case anchors other sections link to
        fixes = self.fixes()
        body = [self.problems(), self.header(), self.howto(), self.changes(),
                self.drift_alerts(), matrix, self.drift_plots(), self.ledger(), fixes,
                self.timing(), self.runs_table(), self.details()]
        nav = [("latest", "Latest run"), ("changes", "What changed"),
               ("drift-alerts", "Drift alerts"), ("matrix", "Outcome matrix"),
               ("drift", "Drift plots"), ("xfails", "Xfail ledger")]
        if fixes:
            nav.append(("fixes", "Fix verification"))
        nav += [("timing", "Timing"), ("runs", "Runs"), ("details", "Case details")]
        navh = " · ".join(f'<a href="#{a}">{t}</a>' for a, t in nav)
        gen = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
                f'<meta name="viewport" content="width=device-width, initial-scale=1">'
                f'<title>{escape(self.title)}</title><style>{CSS}</style></head><body>'
                f'<header><h1>{escape(self.title)}</h1><p class="sub">generated {gen} by '
                f'<code>python -m harness report</code> · {len(self.h.runs)} run(s)</p>'
                f'<nav>{navh}</nav></header><main>{"".join(body)}</main></body></html>')


def render(h: History, cfg: drift_mod.DriftConfig = drift_mod.DriftConfig(),
           registry_path: Path | None = None) -> str:
    return Report(h, cfg, registry_path).render()


def default_registry(h: History) -> Path | None:
    """The registry the latest run used, if it still exists; else scenarios/xfails.yaml."""
    if not h.empty:
        p = h.latest["meta"].get("registry")
        if p and Path(p).is_file():
            return Path(p)
    p = Path("scenarios/xfails.yaml")
    return p if p.is_file() else None


CSS = """
:root{--pass:#d5f0da;--passb:#2e7d32;--fail:#f9c7c5;--failb:#c62828;--xfail:#ffe2b0;
--xfailb:#b26a00;--xpass:#e7cdf3;--xpassb:#7b1fa2;--skip:#e4e4e4;--skipb:#616161}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
margin:0;color:#1d1d1f;background:#fafafa}
header{background:#24303f;color:#fff;padding:12px 24px}
header h1{margin:0;font-size:22px}header .sub{color:#c9d3df;margin:2px 0 6px}
nav a{color:#9fd0ff;text-decoration:none;margin-right:2px}nav a:hover{text-decoration:underline}
main{padding:8px 24px 40px;max-width:1500px}
section{margin:18px 0 26px}h2{font-size:19px;border-bottom:2px solid #d0d7de;padding-bottom:3px}
h3{font-size:16px;margin:18px 0 4px}.help{color:#444;max-width:1000px;margin-top:0}
.sub{color:#666;font-size:12.5px}code{font:12.5px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.cmd{background:#f0f2f4;padding:1px 4px;border-radius:3px;word-break:break-all}
table{border-collapse:collapse;background:#fff}
th,td{border:1px solid #d0d7de;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f3f5f7;font-weight:600}caption{caption-side:top;text-align:left;font-weight:600;
padding:2px 0}
table.small{font-size:12.5px}
.data td.det{max-width:620px;font-size:12.5px;word-break:break-word}
.mods{display:flex;flex-wrap:wrap;gap:14px;align-items:flex-start}
table.matrix td.cell{padding:0;text-align:center;min-width:74px}
table.matrix td.cell a{display:block;padding:5px 7px;color:inherit;text-decoration:none;
font-weight:600;font-size:12.5px}
table.matrix td.cell a:hover{outline:2px solid #1f5fa8}
table.matrix th.corner{font-weight:400;color:#666;font-size:12px}
.o-passed{background:var(--pass);color:var(--passb)}.o-failed{background:var(--fail);color:var(--failb)}
.o-xfailed{background:var(--xfail);color:var(--xfailb)}.o-xpassed{background:var(--xpass);color:var(--xpassb)}
.o-skipped{background:var(--skip);color:var(--skipb)}.o-none{background:#fff;color:#aaa;text-align:center}
.badge{display:inline-block;padding:0 6px;border-radius:9px;font-size:12px;font-weight:600;
white-space:nowrap}td .badge{white-space:normal}td.st{min-width:210px}
.legend{display:grid;grid-template-columns:repeat(auto-fill,minmax(430px,1fr));gap:2px 18px;
margin-bottom:8px;font-size:13px;max-width:1400px}.legend b{grid-column:1/-1}
.kvgrid{display:grid;grid-template-columns:repeat(auto-fill,minmax(330px,1fr));gap:0 16px;
max-width:1400px;background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:6px 10px}
.kvi{display:flex;gap:8px;padding:2px 0;border-bottom:1px solid #f0f0f0}
.kvi .k{color:#555;min-width:150px;font-weight:600}
.verdict{font-size:15px}.verdict.ok b{color:var(--passb)}.verdict.bad b{color:var(--failb)}
p.verdict.ok{color:var(--passb)}p.verdict.bad{color:var(--failb)}
.warn{background:#fff4e5;border:1px solid #f0b35a;padding:4px 14px;border-radius:6px}
.figs{display:grid;grid-template-columns:repeat(auto-fill,minmax(490px,1fr));gap:12px}
figure{margin:0;background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:6px}
figure img{width:100%;height:auto;display:block}figcaption{font-size:12.5px;word-break:break-word}
.cellbox{border:1px solid #d0d7de;border-radius:6px;background:#fff;padding:2px 12px 8px;
margin:12px 0}.cellbox h3{font-size:15px}.up{font-size:12px;font-weight:400}
.case{border-top:1px solid #eee;padding:6px 0}.casehead code{font-weight:600}
.summary{margin:2px 0 4px;color:#333}.kvline{margin:2px 0;font-size:13px}
details summary{cursor:pointer;color:#1f5fa8}.howto{margin:10px 0;background:#fff;
border:1px solid #d0d7de;border-radius:6px;padding:6px 12px;max-width:1000px}
ul.notes{color:#555;font-size:13px}:target{outline:3px solid #1f5fa8;outline-offset:2px}
"""
