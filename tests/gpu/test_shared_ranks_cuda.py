"""Ranks sharing a GPU give the recorded outcomes and measurements (GPU with TE; skips without).

Runs a few TE cases with every rank on a shared GPU over gloo (``--gpu-share always``), as a
user would (pytest with the plugin, in a subprocess), and compares them with a committed shared
run of the same cases (tests/fixtures/gpu/: one H100's rows of a whole-matrix run, one H200's
run of these cases alone): each case's outcome and -- against the recording of this GPU model
and TE version, where there is one -- each check's element counts exactly and its other
measurements and the losses closely. The cases are
bf16 and Float8CurrentScaling; a 4-rank TP case through the #2713 port is among them.
"""

from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "gpu"
# the recordings: (directory, run id); each holds its GPU model and TE version in its rows
RECORDINGS = (("h100x1-te2.20.2-invariance", "20261125T205134-02617-4bf33e48d1d2"),
              ("h200x1-te2.20.2-shared", "20261129T080146-00572-c7810fc3e919"))
CASES = ["bf16-dp2-Linear-sync-none", "current-dp2-LayerNormMLP-sync-to_hsdp2x1",
         "current-dp2-Linear-async_thread-none", "current-dp2xtp2-LayerNormMLP-sync-none"]
KEY = ["case_id", "check", "quantity", "metric"]
COUNTS = ("n_diff", "violations", "n_over")  # whole numbers: equal or not
REL = 1e-4  # float measurements: see test_measured_values_are_the_recorded_ones


def _ids(names):
    return [f"fsdp2_tp_dcp[{n}]" for n in names]


@pytest.fixture(scope="module")
def shared_run(require_te, run_matrix):  # tests/gpu/conftest.py
    require_te()
    proc, summary, history = run_matrix("shared", CASES, "--gpu-share", "always",
                                           timeout_s=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return summary, history


def _recorded(which: int = 0):
    directory, run = RECORDINGS[which]
    summary = pd.read_csv(FIXTURES / directory / "runs" / run / "summary.csv")
    history = pd.read_parquet(FIXTURES / directory / "history" / f"{run}.parquet")
    return summary, history


def _recordings_by_machine() -> dict:
    """Every recording, by the (GPU model, TE version) it was made on."""
    return {(h.gpu_name.iloc[0], h.te_version.iloc[0]): (s, h)
            for s, h in map(_recorded, range(len(RECORDINGS)))}


def _measured(history):
    """Every check's measured values and the training losses per step (``trace``)."""
    mine = history[history.case_id.isin(_ids(CASES))]
    rows = mine[mine.row_outcome.isin(["pass", "fail"]) | (mine.check == "trace")]
    return rows.set_index(KEY).value.sort_index()


def test_every_rank_ran_shared_over_gloo(shared_run):
    summary, _ = shared_run
    assert sorted(summary.case_id) == sorted(_ids(CASES))
    assert set(summary.pg_backend) == {"gloo"}, summary[["case_id", "pg_backend"]]
    assert (summary.ranks_per_gpu >= 2).all(), summary[["case_id", "ranks_per_gpu"]]


def test_outcomes_are_the_recorded_ones(shared_run):
    summary, _ = shared_run
    recorded, _ = _recorded()
    got = summary.set_index("case_id").case_outcome.sort_index()
    want = recorded.set_index("case_id").case_outcome.loc[got.index]
    assert got.to_dict() == want.to_dict()
    assert set(got) == {"passed"}


def test_measured_values_are_the_recorded_ones(shared_run):
    """Counts (differing elements, violations) exactly; float measurements and the losses to a
    relative 1e-4. Not bit for bit: this test's first run on the recorded GPU model compared
    every value exactly and found fp32_parity values differing from the
    recorded run in their last digits (update_norms rel-L2 0.000937 in both at 3 significant
    digits) -- values measured against the FP32 reference, recomputed in each run; the
    round trips' element counts were equal."""
    _, history = shared_run
    gpu, te = history.gpu_name.iloc[0], history.te_version.iloc[0]
    recordings = _recordings_by_machine()
    if (gpu, te) not in recordings:
        pytest.skip(f"recorded on {sorted(recordings)}, this is {gpu} with TE {te}: values are "
                    "compared on a recorded GPU model and TE version only")
    got, want = _measured(history), _measured(recordings[gpu, te][1])
    # checks added to the scenario since the recording (sharding_invariance) have nothing to
    # compare with; every check the recording has must still be there
    checks = set(want.index.get_level_values("check"))
    assert checks <= set(got.index.get_level_values("check"))
    # every recorded value must be measured again; a metric a check gained since (the two-slice
    # sharding_invariance's n_diff, now bitwise) has nothing to compare with
    missing = want.index.difference(got.index)
    assert missing.empty, f"{len(missing)} recorded values not measured: {list(missing)[:8]}"
    table = _mismatches(got.loc[want.index], want)
    assert table.empty, table.to_string()


def _mismatches(got, want) -> pd.DataFrame:
    """The values that differ: counts at all, other measurements beyond ``REL``."""
    assert len(want) > 100 and got.index.equals(want.index)
    counts = got.index.get_level_values("metric").isin(COUNTS)
    both_nan = got.isna() & want.isna()
    exact = counts & (got != want) & ~both_nan
    close = ~counts & ~both_nan & ~((got - want).abs() <= REL * want.abs())
    return pd.DataFrame({"now": got[exact | close], "recorded": want[exact | close]})


@pytest.mark.parametrize("which", range(len(RECORDINGS)), ids=[d for d, _ in RECORDINGS])
def test_the_comparison_sees_a_changed_count_and_a_moved_value(which):
    """CPU: each recording against itself has no mismatch; one more differing element, or a
    measurement moved by 2e-4 of itself, is one. Every recording holds the four cases, all
    passed, on one GPU model and TE version."""
    summary, history = _recorded(which)
    assert sorted(summary.case_id) == sorted(_ids(CASES))
    assert set(summary.case_outcome) == {"passed"}
    assert history.gpu_name.nunique() == 1 and history.te_version.nunique() == 1
    want = _measured(history)
    assert _mismatches(want.copy(), want).empty
    count = want.index[want.index.get_level_values("metric") == "n_diff"][0]
    value = want.index[(want.index.get_level_values("metric") == "rel_l2") & (want > 0)][0]
    for key, moved in ((count, want[count] + 1), (value, want[value] * (1 + 2 * REL))):
        got = want.copy()
        got[key] = moved
        assert list(_mismatches(got, want).index) == [key]
