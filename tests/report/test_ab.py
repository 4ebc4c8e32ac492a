"""python -m harness ab: a speed change kept only with a >= 10% gain and the same outcomes."""

import json

from harness.__main__ import main
from harness.report import ab

OUT = {"passed": 320, "xfailed": 182, "skipped": 368}


def _runs(tmp_path, side, walls, outcomes=OUT):
    paths = []
    for i, w in enumerate(walls):
        p = tmp_path / f"{side}{i}.json"
        p.write_text(json.dumps(dict(valid=True, wall_s=w, outcomes=outcomes, label=p.stem)))
        paths.append(str(p))
    return paths


def _ab(tmp_path, capsys, a, b, **kw):
    code = main(["ab", "--a", *_runs(tmp_path, "a", a), "--b", *_runs(tmp_path, "b", b, **kw)])
    return code, capsys.readouterr()


def test_a_gain_of_ten_percent_with_the_same_outcomes_is_kept(tmp_path, capsys):
    code, got = _ab(tmp_path, capsys, [100.0, 96.0], [86.0, 88.0])
    assert code == 0 and "keep: 11.2% faster (>= 10%)" in got.out
    assert "A: 100.0 s / 96.0 s (mean 98.0 s)" in got.out and "B: 86.0 s / 88.0 s" in got.out


def test_a_smaller_gain_a_loss_or_changed_outcomes_are_not_kept(tmp_path, capsys):
    code, got = _ab(tmp_path, capsys, [95.9, 88.2], [101.0, 86.6])  # 2026-11-29's 3 / 4 / 3 lanes
    assert code == 1 and "not kept: 1.9% slower" in got.out
    code, got = _ab(tmp_path, capsys, [22.1, 23.3], [22.6, 21.1])  # ... and compile_preload
    assert code == 1 and "not kept: 3.7% faster, below 10%" in got.out
    code, got = _ab(tmp_path, capsys, [84.5], [92.0])
    assert code == 1 and "not kept: 8.9% slower" in got.out
    code, got = _ab(tmp_path, capsys, [100.0], [80.0], outcomes={**OUT, "failed": 1})
    assert code == 1 and "outcomes differ: not a speed change" in got.out


def test_a_gain_within_the_noise_says_so():
    j = ab.judge([dict(wall_s=w, outcomes=OUT) for w in (100.0, 80.0)],
                 [dict(wall_s=w, outcomes=OUT) for w in (70.0, 90.0)])
    assert j["keep"] and j["verdict"].endswith("but some B run was slower than some A run")


def test_a_file_that_is_no_bench_run_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"valid": false, "wall_s": 1}')
    assert main(["ab", "--a", str(bad), "--b", str(bad)]) == 2
    assert "not a valid bench run" in capsys.readouterr().err
    bad.write_text("{")
    assert main(["ab", "--a", str(bad), "--b", str(bad)]) == 2
    assert "not JSON" in capsys.readouterr().err
