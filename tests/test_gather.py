"""The harness's own gather (harness/distributed/gather.py): whole tensors from DTensor shards over
gloo, mixed dtypes and odd sizes packed into one byte buffer, replicas checked for agreement.
Two plain subprocesses (no multiprocessing: its resource tracker would outlive the test)."""

import sys
import textwrap
from pathlib import Path

from subprocs import harness_env, run_all

ROOT = Path(__file__).resolve().parent.parent

RANK = textwrap.dedent("""\
    import sys
    import torch
    import torch.distributed as dist
    rank, store = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from harness.distributed import gather
    gather.GROUP = dist.new_group(backend="gloo")
    mesh = init_device_mesh("cpu", (2,))
    g = gather.Gather()
    want = {}
    for key, t in [("f32", torch.arange(15.0).reshape(5, 3)),  # uneven: 3 + 2 rows
                   ("bf16", torch.linspace(-1, 1, 7).bfloat16()),
                   ("u8", torch.arange(9, dtype=torch.uint8)),
                   ("flag", torch.tensor([True, False, True]))]:
        d = distribute_tensor(t, mesh, [Shard(0)])
        g.add(key, d, d.to_local())
        want[key] = t
    r = distribute_tensor(torch.ones(3), mesh, [Replicate()])
    g.add("rep", r, r.to_local() + (rank == 1))  # the replicas disagree on rank 1
    g.add_scalar("loss", torch.tensor(0.5))
    g.add_scalar("step", torch.tensor(rank))
    out = g.run()
    if rank == 0:  # whole tensors on rank 0
        for k, t in want.items():
            assert out[k].dtype == t.dtype and torch.equal(out[k], t), (k, out[k], t)
        assert out["loss"].item() == 0.5 and out["step"].tolist() == [0, 1]
        diverged = [k for k in out if k.startswith("rep#replicas_diverge(ranks 0 vs 1")]
        assert len(diverged) == 1 and "flat index 0: 1 vs 2" in diverged[0], list(out)
        assert list(gather.entries(out, ["rep", "f32", "absent"])) == ["rep"] + diverged + ["f32"]
    else:  # placeholders elsewhere: the same keys, shapes and dtypes, no values
        assert sorted(out) == sorted(list(want) + ["rep", "loss", "step"]), list(out)
        for k, t in want.items():
            assert out[k].is_meta and out[k].shape == t.shape and out[k].dtype == t.dtype, k
        assert not any(gather.held(v) for v in out.values())
        try:
            out["f32"].sum().item()
        except RuntimeError:
            pass
        else:
            raise AssertionError("a placeholder's values were readable")
    # a second, smaller gather in a row: the byte buffers are sized afresh
    g = gather.Gather()
    d = distribute_tensor(torch.arange(4.0), mesh, [Shard(0)])
    g.add("again", d, d.to_local())
    out = g.run()
    assert (rank == 0) == gather.held(out["again"])
    if rank == 0:
        assert out["again"].tolist() == [0.0, 1.0, 2.0, 3.0]
    dist.destroy_process_group()
    print("ok", flush=True)
    # no interpreter teardown (as the harness's ranks): gloo's threads can abort it with
    # "terminate called without an active exception" after the test's work is done
    import os
    os._exit(0)
    """)


def test_gather_mixed_dtypes_uneven_shards_and_diverging_replicas(tmp_path):
    store = str(tmp_path / "store")  # a file rendezvous: no port to race for
    done = run_all([[sys.executable, "-c", RANK, str(r), store] for r in range(2)], timeout=120,
                   cwd=ROOT, env=harness_env())
    assert [rc for rc, _ in done] == [0, 0], done
    assert all(out.strip().endswith("ok") for _, out in done), done


def test_every_rank_decides_alike_which_quantized_buffers_to_gather():
    """The all-gather parity gathers a param's raw buffers by one set of keys on every rank:
    30 rows over 4 ranks (8, 8, 8, 6) once left rank 3 alone adding the rowwise data (its 6
    rows divide 30), and rank 0 compared nothing of it. Rowwise data follows the piece at any
    sharding; block scales (one row per 128 rows) only at even shards."""
    from types import SimpleNamespace

    import torch
    from torch.distributed.tensor import Shard

    from harness.checks.te_checks import _whole_shape

    def decisions(whole, rows):
        mesh = SimpleNamespace(size=lambda dim: len(rows))
        p = SimpleNamespace(placements=(Shard(0),), shape=torch.Size([whole, 32]),
                            device_mesh=mesh)
        return [(_whole_shape("data", torch.empty(r, 32), torch.empty(r, 32), p),
                 _whole_shape("scale_inv", torch.empty(1, 1), torch.empty(r, 32), p))
                for r in rows]
    uneven = decisions(30, [8, 8, 8, 6])
    assert uneven == [((30, 32), None)] * 4
    assert decisions(32, [8, 8, 8, 8]) == [((32, 32), (4, 1))] * 4
