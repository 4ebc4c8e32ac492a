"""Fixtures shared by the report tests (here, not imported into each module: a fixture imported
by name and then taken as a test's argument reads as a redefinition to linters)."""

from synth_history import report_dir  # noqa: F401
