"""A user's own configuration, end to end, on every reference recipe
(tests/scenarios/unseen_config.yaml): world 3 (block: 2), dims that are not multiples of 8, 5
steps at lr 3e-3, seed 7, reshard 3 -> 2 -- configurations no calibration ran. Every calibrated
quantity is judged by a population measured on demand for its configuration (never borrowed,
never ``tol nan``): every clean case passes; every sized bug fails -- a 1.5x learning rate,
weights never updated, gradients rounded to bf16 after the reduction and on their way into it.
The torch backend's reshards 2 -> 3 and 6 -> 4, the cache and ``--calibrate off``:
tests/test_unseen_config_torch.py."""

import pytest

from unseen import assert_clean_cases_pass_on_demand, cases, run

pytestmark = pytest.mark.integration
CAUGHT_BY = {"lr_scale_1.5": {("fp32_parity", "update_norms")},
             "frozen_weights": {("fp32_parity", "update_norms"), ("fp32_parity", "params_updated")},
             "grads_bf16": {("sharding_invariance", "grads")},
             "grads_bf16_before_reduce": {("sharding_invariance", "grads")}}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run(tmp_path_factory.mktemp("unseen"), "reference")


def test_every_clean_case_passes_by_a_tolerance_of_its_own_configuration(reference):
    assert_clean_cases_pass_on_demand(reference, want=7)  # every recipe


def test_every_sized_bug_fails_on_every_recipe(reference):
    _, out, df = reference
    bugs = df[~df["axes"].str.contains('"fault": "none"')]
    outcomes = cases(bugs)
    assert len(outcomes) == 7 * len(CAUGHT_BY), out[-3000:]
    assert set(outcomes.values()) == {"failed"}, outcomes
    failed = bugs[bugs["row_outcome"] == "fail"]
    faults = failed["axes"].str.extract(r'"fault": "([^"]+)"')[0]
    for (case, fault), g in failed.groupby(["case_id", faults]):
        caught = set(zip(g["check"], g["quantity"]))
        assert caught & CAUGHT_BY[fault], (case, sorted(caught))
