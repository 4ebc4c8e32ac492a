"""One self-contained HTML report from a results history.

Plain HTML + CSS from the Jinja2 templates in ``templates/`` (autoescaped), figures as inline
SVG, no JavaScript and no network access at view time: the file can be mailed, uploaded as a CI
artifact or served from GitHub Pages as is.

The data of each section comes from :mod:`harness.report.sections` (no HTML there); this module
only renders it: ``templates/base.html.j2`` is the page, with one block per section, each
filled by its own template.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import jinja2

from harness.report import drift as drift_mod
from harness.report import fmt, sections
from harness.report.context import ReportContext
from harness.report.history import History
from harness.report.outcomes import ROW_CLASS, badge_class, worst  # noqa: F401  (worst: public helper)
from harness.report.sections import coverage

TITLE = "Distributed correctness report"


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("harness.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)
    env.filters.update(fmt.FILTERS)
    env.globals.update(badge_class=badge_class, row_class=lambda o: ROW_CLASS.get(o, "skipped"),
                       coverage_label=coverage.LABEL, coverage_class=coverage.CLASS,
                       no_coverage=coverage.NO_ROWS)
    return env


def render(h: History, cfg: drift_mod.DriftConfig = drift_mod.DriftConfig(),
           registry_path: Path | None = None, title: str = TITLE) -> str:
    """The report of history ``h`` as one HTML page."""
    data = sections.build(ReportContext(h, cfg, registry_path))
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return environment().get_template("base.html.j2").render(
        title=title, generated=generated, n_runs=len(h.runs), **data)


def default_registry(h: History) -> Path | None:
    """The registry the latest run used, if it still exists; else scenarios/xfails.yaml."""
    if not h.empty:
        p = h.latest["meta"].get("registry")
        if p and Path(p).is_file():
            return Path(p)
    p = Path("scenarios/xfails.yaml")
    return p if p.is_file() else None
