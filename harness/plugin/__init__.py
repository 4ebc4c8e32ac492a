"""The pytest stage: ``pytest --scenario NAME`` -> selected cases as pytest items, skips and
strict xfails attached, each item's result from the launch stage judged by the verdict stage,
the run's rows handed to the results stage. ``harness.plugin`` is the pytest plugin (the
``pytest11`` entry point): its hooks are in ``hooks``; the run's state in ``session``."""

from harness.plugin.hooks import (  # noqa: F401 - pytest finds its hooks on this module
    pytest_addoption,
    pytest_collect_file,
    pytest_configure,
    pytest_runtest_makereport,
    pytest_unconfigure,
)
