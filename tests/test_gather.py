"""The harness's own gather (harness/worker/gather.py): whole tensors from DTensor shards over
gloo, mixed dtypes and odd sizes packed into one byte buffer, replicas checked for agreement."""

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        from harness.worker import gather
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
        local = r.to_local() + (rank == 1)  # the replicas disagree on rank 1
        g.add("rep", r, local)
        g.add_scalar("loss", torch.tensor(0.5))
        g.add_scalar("step", torch.tensor(rank))
        out = g.run()
        for k, t in want.items():
            assert out[k].dtype == t.dtype and torch.equal(out[k], t), (k, out[k], t)
        assert out["loss"].item() == 0.5 and out["step"].tolist() == [0, 1]
        diverged = [k for k in out if k.startswith("rep#replicas_diverge(ranks 0 vs 1")]
        assert len(diverged) == 1 and "flat index 0: 1 vs 2" in diverged[0], list(out)
        q.put((rank, "ok"))
    except BaseException as e:  # reported to the test, which fails with it
        q.put((rank, repr(e)))
    finally:
        dist.destroy_process_group()


def test_gather_mixed_dtypes_uneven_shards_and_diverging_replicas():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _port()
    procs = [ctx.Process(target=_rank, args=(r, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = dict(q.get(timeout=90) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert got == {0: "ok", 1: "ok"}
