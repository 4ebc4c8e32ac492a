"""Row outcomes and the coverage rows' metric: plain names, importable without torch (the
pytest process reads rows before, or without, importing it)."""

FAILED = ("fail", "error")
COVERAGE = "coverage"  # the metric of coverage rows
COVERAGE_STATUSES = ("passed", "failed", "xfailed", "not_run")
