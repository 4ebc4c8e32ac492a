"""harness/ says what the code does and why, not when and where something was measured: no date
(``2026-11-25``) and no GPU model (``H100``) in any of its modules, templates or docs. Such
figures belong in docs/ (docs/findings.md) or in a commit message, where their date is kept."""

import re
from pathlib import Path

HARNESS = Path(__file__).resolve().parent.parent / "harness"
TEXT = {".py", ".j2", ".md", ".css", ".txt"}
DATED = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\b(?:[ABH]\d00|GB\d00)\b")


def dated_figures(text: str) -> list[str]:
    return [m.group(0) for m in DATED.finditer(text)]


def test_harness_carries_no_dates_or_machine_names():
    found = []
    for f in sorted(HARNESS.rglob("*")):
        if f.is_file() and f.suffix in TEXT and "__pycache__" not in f.parts:
            for n, line in enumerate(f.read_text().splitlines(), 1):
                if dated_figures(line):
                    found.append(f"{f.relative_to(HARNESS.parent)}:{n}: {line.strip()}")
    assert not found, "dates / machine names in harness/ (move them to docs/):\n" + \
        "\n".join(found)


def test_what_counts_as_a_dated_figure():
    assert dated_figures("one H100, 2026-11-25; 2x H200; B200") == ["H100", "2026-11-25",
                                                                   "H200", "B200"]
    assert dated_figures("'YYYY-MM-DD HH:MM UTC', 2.20.2, sm_90, H2O, 12-11, dp2xtp2") == []
