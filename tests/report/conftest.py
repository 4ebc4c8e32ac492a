"""The report tests' shared fixture: ``report_dir`` (synth_history.py), found by pytest here
rather than imported by each module (an imported fixture used as an argument redefines it)."""

from synth_history import report_dir  # noqa: F401
