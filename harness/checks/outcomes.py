"""Row outcomes and the coverage rows' metric: plain names, importable without torch (the
pytest process reads rows before, or without, importing it)."""

FAILED = ("fail", "error")
COVERAGE = "coverage"  # the metric of coverage rows
COVERAGE_STATUSES = ("passed", "failed", "xfailed", "not_run")
# a toleranced comparison's count of what no size measures: missing / extra keys, shape or
# dtype mismatches, disallowed NaN / inf (Recorder.compare); an up_to bound never explains it
PROBLEMS = "n_problems"
