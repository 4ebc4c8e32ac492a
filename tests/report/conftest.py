"""The report tests' shared fixture (synth_history.py builds the histories): ``report_dir``,
provided here so the test modules use it without importing it (an imported fixture that a
test takes as an argument is a redefinition to ruff, F811)."""

from synth_history import report_dir  # noqa: F401
