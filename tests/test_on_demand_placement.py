"""On-demand variants measure a case where the case runs.

On two GPUs a dp2 -> dp4 case runs every phase over gloo (its reshard shares the GPUs), while
a dp2 case gets a GPU a rank over NCCL. Its train-phase populations were measured by variants
without the reshard -- dp2 cases, which ran over NCCL: their samples landed in the NCCL
population and the case's own (gloo, world 2) had none. A QA probe on 2 H200s (TE, a user's
dims, 12 steps) left 36 quantities of 5 such cases unjudged. Such a case's train phase is now
measured by its own variants (with the reshard), whose train rows count too."""

from types import SimpleNamespace

import pytest

from harness.plugin.on_demand import OnDemand
from harness.spec.matrix import expand
from harness.spec.scenario import load_scenario

SCENARIO = """name: mine
description: d
axes:
  recipe: [fp32]
  mesh: [dp2]
  module: [LayerNormMLP]
  dcp: [sync]
  reshard: [none, to_dp4, to_hsdp2x2]
model: {hidden: 40, ffn: 56, heads: 4, seq: 4, batch: 8, out_features: 24}
"""


def _two_gpus(case):  # the host's placement: a GPU a rank up to 2 ranks, else shared
    return ("gloo", 2) if max(case.world_sizes) > 2 else ("nccl", 1)


def _one_gpu(case):
    return ("gloo", max(case.world_sizes))


def _od(placement):
    hs = SimpleNamespace(device="cuda", run_id="20261130T000000-1-x",
                         config=SimpleNamespace(getoption=lambda k, d=None: "on", cache=None),
                         env=SimpleNamespace(describe=lambda: {}, placement=placement),
                         record=SimpleNamespace(write_reports=False))
    return OnDemand(hs)


@pytest.fixture
def cases(tmp_path):
    (tmp_path / "mine.yaml").write_text(SCENARIO)
    return sorted(expand(load_scenario(tmp_path / "mine.yaml"), "reference"),
                  key=lambda c: (c.target is not None, c.ax["reshard"]))


class _Scheduler:
    """Every variant's result: a train-phase and a reshard row, its error its seed's."""

    def result(self, v):
        err = 1e-6 * v.train.seed
        rows = [dict(phase="train", check="fp32_parity", quantity="params", metric=m,
                     value=err, outcome="unjudged") for m in ("max_abs", "rel_l2")]
        if v.target is not None:
            rows += [dict(phase="reshard", check="reshard", quantity="next_params", metric=m,
                          value=err, outcome="unjudged") for m in ("max_abs", "rel_l2")]
        return SimpleNamespace(rows=rows, status="passed", seconds=0.1)


def _populations(od) -> set[tuple]:
    """(pg, world) of the fp32_parity / reshard params populations measured on demand."""
    return {(k[6], k[8], k[0]) for k in od.pools.measured if k[1] in ("params", "next_params")
            and k not in od.pools.packaged}


def test_a_case_whose_reshard_shares_the_gpus_measures_its_training_there_too(cases):
    plain, _, moved = cases
    od = _od(_two_gpus)
    variants = od.plan([(moved, [])])
    assert len(variants) == 10 and all(v.target is not None for v in variants), variants
    (key,) = od.case_group[moved.id]
    assert key in od.whole and od.serves(key) == {False, True}
    od._measure(key, _Scheduler())
    assert _populations(od) == {("gloo", "2", "fp32_parity"), ("gloo", "2->4", "reshard")}

    # the dp2 case runs NCCL: its own train-only variants, measured apart
    od.plan([(plain, [])])
    (own,) = od.case_group[plain.id]
    assert own not in od.whole and od.base[own].target is None
    od._measure(own, _Scheduler())
    assert ("nccl", "2", "fp32_parity") in _populations(od)


def test_where_the_train_only_copy_runs_alike_it_measures_the_training(cases):
    """One GPU: every world shares it over gloo, as before -- train-phase populations from
    variants without the reshard (cheaper), the reshard's from variants with it."""
    _, _, moved = cases
    od = _od(_one_gpu)
    variants = od.plan([(moved, [])])
    assert len(variants) == 20
    train, reshard = od.case_group[moved.id]
    assert od.serves(train) == {False} and od.serves(reshard) == {True} and not od.whole
    for key in (train, reshard):
        od._measure(key, _Scheduler())
    # world 2's rows of the reshard variants are their train-only twins' samples: not twice
    assert od.pools.measured[next(k for k in od.pools.measured if k[8] == "2" and
                                  k[1] == "params" and k not in od.pools.packaged)]["n"] == 10


def test_two_reshard_targets_of_one_training_count_it_once(cases):
    """dp2 -> dp4 and dp2 -> hsdp2x2 on two GPUs: two groups of the case's own variants (their
    reshard axes differ), one pool, the same ten trainings -- ten samples of world 2, not 20
    (a review found them counted twice: the pool took each variant's rows by its case id)."""
    _, to_hsdp, to_dp4 = cases
    od = _od(_two_gpus)
    od.plan([(to_dp4, []), (to_hsdp, [])])
    keys = od.case_group[to_dp4.id] + od.case_group[to_hsdp.id]
    assert len(set(keys)) == 2 and all(k in od.whole for k in keys)
    assert len({od.pools.group_pool[k] for k in keys}) == 1
    for key in keys:
        od._measure(key, _Scheduler())
    train = [v for k, v in od.pools.measured.items() if k not in od.pools.packaged
             and k[8] == "2" and k[1] == "params"]
    assert train and all(v["n"] == 10 for v in train), train
    edges = {k[8]: v["n"] for k, v in od.pools.measured.items()
             if k not in od.pools.packaged and k[1] == "next_params"}
    assert edges == {"2->4": 20}, edges  # both targets are world 4: one edge, 20 reshards


def test_whole_pools_of_one_training_are_measured_together(tmp_path):
    """dp2 -> dp4 and dp2 -> dp8 on two GPUs: two pools (their target worlds differ) give the
    same train populations; a case of either is judged after both are measured, so which one
    judges it does not depend on which case came first (a review's finding)."""
    (tmp_path / "mine.yaml").write_text(SCENARIO.replace("[none, to_dp4, to_hsdp2x2]",
                                                         "[to_dp4, to_dp8]")
                                        .replace("batch: 8", "batch: 16"))
    to_dp4, to_dp8 = sorted(expand(load_scenario(tmp_path / "mine.yaml"), "reference"),
                            key=lambda c: c.target.world_size)
    od = _od(_two_gpus)
    od.plan([(to_dp4, []), (to_dp8, [])])
    mine, theirs = od.case_group[to_dp4.id], od.case_group[to_dp8.id]
    assert {od.pools.group_pool[k] for k in mine} != {od.pools.group_pool[k] for k in theirs}
    both = {od.pools.group_pool[k] for k in mine + theirs}
    assert od.pools_of(mine) == od.pools_of(theirs) == both
