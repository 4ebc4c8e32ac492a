"""History files: atomic writes, unique run ids, page checksums that catch flipped bits, and
drift refusing to judge an older run when the newest history file is corrupt."""

import random
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from harness.__main__ import main
from harness.report import history
from harness.results import write as results

sys.path.insert(0, str(Path(__file__).resolve().parent / "report"))
from synth_history import A, make_case, write_run  # noqa: E402

FLIPS = 300


def _cases(n=150, seed=0):
    rng = random.Random(seed)
    return [make_case(dict(A, module=f"M{i}"), metrics={
        ("fp32_parity", "loss", "max_abs"): rng.random() * 1e-5,
        ("fp32_parity", "params", "rel_l2"): rng.random() * 1e-3,
        ("reshard", "state", "n_diff"): float(rng.randint(0, 3))}) for i in range(n)]


def _value_chunk(path: Path) -> tuple[int, int]:
    """(first byte, size) of the ``value`` column chunk: its dictionary and data pages."""
    md = pq.ParquetFile(path).metadata
    cc = md.row_group(0).column(md.schema.to_arrow_schema().get_field_index("value"))
    start = cc.dictionary_page_offset if cc.has_dictionary_page else cc.data_page_offset
    return start, cc.total_compressed_size


def _flip_outcomes(path: Path, read, tmp: Path) -> dict:
    """Flip one bit at FLIPS positions spread over the value column's pages; count reads that
    fail (detected), return changed values (silent) or return the original values (none)."""
    data, orig = path.read_bytes(), read(path)
    start, size = _value_chunk(path)
    counts = dict(detected=0, silent=0, none=0)
    bad = tmp / "flipped.parquet"
    for i in range(FLIPS):
        b = bytearray(data)
        b[start + i * size // FLIPS] ^= 1 << (i % 8)
        bad.write_bytes(bytes(b))
        try:
            got = read(bad)
        except Exception:  # noqa: BLE001 -- any failure to read is a detection
            counts["detected"] += 1
            continue
        same = len(got) == len(orig) and all(x == y or (x != x and y != y)
                                              for x, y in zip(got, orig))
        counts["none" if same else "silent"] += 1
    return counts


def test_bit_flips_in_values_are_detected(tmp_path, monkeypatch):
    (tmp_path / "after" / "history").mkdir(parents=True)
    (tmp_path / "before" / "history").mkdir(parents=True)
    after = write_run(tmp_path / "after", 1, _cases())
    # before: how the history was written and read until now (no page checksums)
    real = pq.write_table
    monkeypatch.setattr(pq, "write_table", lambda t, p, **kw: real(t, p))
    before = write_run(tmp_path / "before", 1, _cases())
    monkeypatch.setattr(pq, "write_table", real)

    old = _flip_outcomes(before, lambda p: pq.read_table(p).column("value").to_pylist(), tmp_path)
    new = _flip_outcomes(after, lambda p: history.read_run(p)[0]["value"].tolist(), tmp_path)
    print(f"\n{FLIPS} single-bit flips in the value column's pages: before {old}; after {new}")
    assert old["silent"] > FLIPS // 2  # the measurement can see silent changes
    assert new["silent"] == 0  # every flip that changes a value fails the read
    assert new["detected"] >= FLIPS - new["none"]


def _flip_value_page(path: Path) -> None:
    start, size = _value_chunk(path)
    b = bytearray(path.read_bytes())
    b[start + size // 2] ^= 0x10
    path.write_bytes(bytes(b))


def test_drift_fails_when_the_latest_run_is_corrupt(tmp_path, capsys):
    (tmp_path / "history").mkdir()
    write_run(tmp_path, 1, _cases(20), run_id="20260101T010000-00001-aaaaaa")
    latest = write_run(tmp_path, 2, _cases(20, seed=1), run_id="20260101T020000-00002-bbbbbb")
    assert main(["drift", "--history", str(tmp_path / "history")]) == 0
    capsys.readouterr()
    _flip_value_page(latest)
    assert main(["drift", "--history", str(tmp_path / "history")]) == 2
    err = capsys.readouterr().err
    assert f"error: {latest}" in err and "CRC" in err and "cannot be judged" in err
    # an explicit --at still judges the run asked for
    assert main(["drift", "--history", str(tmp_path / "history"),
                 "--at", "20260101T010000-00001-aaaaaa"]) == 0


def test_a_corrupt_older_run_is_skipped_with_a_warning(tmp_path, capsys):
    (tmp_path / "history").mkdir()
    older = write_run(tmp_path, 1, _cases(20), run_id="20260101T010000-00001-aaaaaa")
    write_run(tmp_path, 2, _cases(20, seed=1), run_id="20260101T020000-00002-bbbbbb")
    _flip_value_page(older)
    assert main(["drift", "--history", str(tmp_path / "history")]) == 0
    assert f"warning: skipped {older}" in capsys.readouterr().err


def test_run_ids_are_unique_within_one_second_and_process():
    ids = [results.new_run_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert not any(pd.isna(history._run_id_date(i)) for i in ids[:3])  # dated, for ordering


def test_result_files_are_written_atomically(tmp_path, monkeypatch):
    (tmp_path / "history").mkdir()
    first = write_run(tmp_path, 1, _cases(5), run_id="r1")
    before = first.read_bytes()

    def broken(table, path, **kw):
        Path(path).write_bytes(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", broken)
    with pytest.raises(OSError, match="disk full"):
        write_run(tmp_path, 1, _cases(5), run_id="r1")
    assert first.read_bytes() == before  # the old file is untouched, no temporary is left
    leftovers = [p.name for p in tmp_path.rglob("*") if p.is_file() and ".tmp" in p.name]
    assert leftovers == []
    monkeypatch.undo()
    write_run(tmp_path, 2, _cases(5), run_id="r2")
    names = sorted(p.name for p in (tmp_path / "runs" / "r2").iterdir())
    assert names == ["meta.json", "summary.csv"]
