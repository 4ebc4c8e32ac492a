"""Results history tools: load + validate the history, HTML report, drift detection, goldens.

``python -m harness {report,drift,goldens}`` (see ``harness/__main__.py`` and docs/report.md).
"""
