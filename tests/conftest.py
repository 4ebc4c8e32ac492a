from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_SCENARIOS = Path(__file__).resolve().parent / "scenarios"


@pytest.fixture
def write_yaml(tmp_path):
    """Write a YAML text to tmp_path/<name>.yaml and return the path."""
    def _write(name: str, text: str) -> Path:
        p = tmp_path / f"{name}.yaml"
        p.write_text(text)
        return p
    return _write
