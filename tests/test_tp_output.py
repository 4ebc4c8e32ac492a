"""The column-parallel output gather (harness/distributed/tp_output.py) equals DTensor's
``full_tensor()`` forward and backward, the vocabulary-sharded lookup the whole embedding, over gloo with two plain subprocesses; and the rule that
places a TP piece's raw buffers in the whole parameter (checks/te_checks._whole_shape)."""

import sys
import textwrap
from pathlib import Path

import torch
from subprocs import harness_env, run_all
from torch.distributed.tensor import Replicate, Shard

from harness.checks.te_checks import _whole_shape

ROOT = Path(__file__).resolve().parent.parent

RANK = textwrap.dedent("""\
    import os, sys
    import torch
    import torch.distributed as dist
    rank, store = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from harness.distributed.tp_output import gather_last_dim
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(rank)
    x = torch.randn(3, 4, 5, requires_grad=True)
    w = torch.randn(3, 4, 10)  # the same on both ranks after the broadcast
    dist.broadcast(w, 0)
    got = gather_last_dim(x * 2, mesh.get_group())
    (got * w).sum().backward()
    g_ours = x.grad.clone()
    x.grad = None
    want = DTensor.from_local(x * 2, mesh, [Shard(2)], run_check=False).full_tensor()
    (want * w).sum().backward()
    assert torch.equal(got, want), (got - want).abs().max()
    assert torch.equal(g_ours, x.grad) and torch.equal(g_ours, 2 * w[..., 5 * rank:5 * rank + 5])
    from torch.distributed.tensor import distribute_tensor
    from harness.distributed.tp_output import vocab_sharded_embedding
    whole = torch.randn(10, 6)
    dist.broadcast(whole, 0)
    emb = torch.nn.Parameter(distribute_tensor(whole, mesh, [Shard(0)]))  # rows 0-4 / 5-9
    ids = torch.tensor([[0, 9, 4, 5], [7, 7, 1, 2]])
    up = torch.randn(2, 4, 6)
    dist.broadcast(up, 0)
    h = vocab_sharded_embedding(ids, emb, mesh.get_group())
    (h * up).sum().backward()
    ref = whole.clone().requires_grad_()
    want_h = torch.nn.functional.embedding(ids, ref)
    (want_h * up).sum().backward()
    assert torch.equal(h, want_h), (h - want_h).abs().max()
    assert torch.equal(emb.grad.to_local(), ref.grad[5 * rank:5 * rank + 5])
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    from harness.distributed.tp_output import ColwiseGathered
    for local in (True, False):  # the output as a plain tensor, or as a Replicate DTensor
        runs = []
        for style in (ColwiseParallel(output_layouts=Replicate(), use_local_output=local),
                      ColwiseGathered(use_local_output=local)):
            torch.manual_seed(7)  # the same whole weights and input on both ranks, both styles
            lin = torch.nn.Linear(4, 10)
            parallelize_module(lin, mesh, style)
            inp = torch.randn(3, 2, 4, requires_grad=True)
            out = lin(inp)
            if not local:
                assert isinstance(out, DTensor) and out.placements == (Replicate(),)
                out = out.to_local()
            (out * w[:, :2, :]).sum().backward()
            runs.append((out.detach(), inp.grad, lin.weight.grad.to_local(),
                         lin.bias.grad.to_local()))
        assert type(runs[0][0]) is torch.Tensor and runs[0][0].shape == (3, 2, 10)
        for a, b in zip(*runs):  # the same whole output, input and local weight gradients
            assert torch.equal(a, b), (a - b).abs().max()
    print("ok", flush=True)
    os._exit(0)
    """)


def test_gather_last_dim_vocab_sharded_embedding_and_colwise_gathered_match_dtensor(tmp_path):
    store = str(tmp_path / "store")
    done = run_all([[sys.executable, "-c", RANK, str(r), store] for r in range(2)], timeout=120,
                   cwd=ROOT, env=harness_env())
    assert [rc for rc, _ in done] == [0, 0], done
    assert all(out.strip().endswith("ok") for _, out in done), done


def test_c10d_gathered_replaces_only_colwise_styles_that_gather_their_output():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from harness.distributed.tp_output import ColwiseGathered, c10d_gathered
    got = c10d_gathered(ColwiseParallel(input_layouts=Shard(0), output_layouts=Replicate(),
                                        use_local_output=False))
    assert type(got) is ColwiseGathered
    assert got.input_layouts == (Shard(0),) and got.use_local_output is False
    for keep in (ColwiseParallel(), RowwiseParallel(), RowwiseParallel(output_layouts=Replicate()),
                 ColwiseParallel(output_layouts=Shard(1))):
        assert c10d_gathered(keep) is keep


class _Mesh:
    def __init__(self, device_type):
        self.device_type = device_type

    def get_group(self):
        return "group"


def test_apply_tp_gathers_with_c10d_only_over_gloo_on_cuda(monkeypatch):
    """The segfault this avoids needs a GPU (tests/gpu/test_torch_shared_tp_cuda.py runs it); here,
    which process groups and devices get the c10d gather, and that the plan is otherwise kept."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from harness.distributed import parallel
    from harness.distributed.tp_output import ColwiseGathered
    seen = []
    monkeypatch.setattr(parallel, "parallelize_module", lambda m, mesh, plan: seen.append(plan))
    row = RowwiseParallel()
    for device, backend, gathered in (("cuda", "gloo", True), ("cuda", "nccl", False),
                                      ("cpu", "gloo", False)):
        monkeypatch.setattr(parallel.dist, "get_backend", lambda g, b=backend: b)
        parallel.apply_tp(None, _Mesh(device),
                          {"proj": ColwiseParallel(output_layouts=Replicate()), "out": row})
        assert (type(seen[-1]["proj"]) is ColwiseGathered) is gathered, (device, backend)
        assert seen[-1]["out"] is row
    parallel.apply_tp(None, _Mesh("cuda"), ColwiseParallel(output_layouts=Replicate()))
    assert type(seen[-1]) is ColwiseGathered  # a single style (gloo, the last backend set)


class _Piece:
    """A DTensor stand-in: whole shape, placements and a mesh of 2 a dim (all ``_whole_shape``
    reads)."""

    def __init__(self, shape, placements):
        self.shape, self.placements = torch.Size(shape), placements
        self.device_mesh = type("Mesh", (), {"size": lambda self, dim: 2})()


def test_whole_shape_places_rowwise_data_and_row_block_scales_only():
    col = _Piece((256, 128), [Shard(0), Shard(0)])  # FSDP x column-parallel TP: 64 local rows
    row = _Piece((128, 256), [Shard(0), Shard(1)])  # FSDP x row-parallel TP: [64, 128] local
    local_col, local_row = torch.empty(64, 128), torch.empty(64, 128)
    assert _whole_shape("rowwise_data", torch.empty(64, 128), local_col, col) == (256, 128)
    assert _whole_shape("rowwise_data", torch.empty(64, 128), local_row, row) == (128, 256)
    # block scales: one row per 32-row block along dim 0, unsharded columns keep their length
    assert _whole_shape("rowwise_scale_inv", torch.empty(2, 4), local_col, col) == (8, 4)
    # ... but not across a sharded column dim (padded block columns do not add up)
    assert _whole_shape("rowwise_scale_inv", torch.empty(2, 4), local_row, row) is None
    assert _whole_shape("transpose", torch.empty(128, 64), local_col, col) is None
    assert _whole_shape("columnwise_data", torch.empty(64, 128), local_col, col) is None
    assert _whole_shape("rowwise_data", torch.empty(64, 128), local_col,
                        _Piece((256, 128), [Replicate(), Shard(0)])) == (256, 128)
    assert _whole_shape("rowwise_data", torch.empty(8192), local_col, col) is None  # flat
