"""Where the one-rank twin stands for a case and how sharding_invariance judges it
(harness/calibration/twin.py), the one-rank FSDP2 all-gather of multi-part quantized tensors
the twin of a block format needs (reference/qtensor.py), and coverage's view of both."""

from types import SimpleNamespace

import pytest
import torch

from harness.calibration import twin
from harness.reference.qtensor import _pack, _unpack
from harness.spec.mesh import parse_mesh

RECIPES = ["fp32", "bf16", "delayed", "current", "block", "mxfp8", "nvfp4"]


def case(mesh, recipe):
    return SimpleNamespace(mesh=parse_mesh(mesh), recipe=recipe)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_two_slices_of_torch_and_reference_are_bitwise_for_every_recipe(backend, recipe):
    """Measured bit-exact on CPU and on a GPU (dp2 over NCCL and shared gloo, dp2xtp2)."""
    for device in ("cpu", "cuda"):
        for mesh in ("dp2", "hsdp2x1", "dp2xtp2"):
            assert twin.not_applicable(case(mesh, recipe), backend, device) is None
            assert twin.bitwise(case(mesh, recipe), backend, device)
            assert not twin.calibrated(case(mesh, recipe), backend, device)
        assert twin.calibrated(case("dp4", recipe), backend, device)


@pytest.mark.parametrize("mesh", ["dp4", "hsdp2x2", "dp8"])
def test_more_slices_take_a_calibrated_tolerance(mesh):
    c = case(mesh, "current")
    assert not twin.bitwise(c, "reference", "cpu") and twin.calibrated(c, "reference", "cpu")


@pytest.mark.parametrize("mesh", ["dp2", "hsdp2x1", "dp2xtp2"])
def test_te_on_a_gpu_is_bitwise_on_two_slices_where_measured(mesh):
    """TE's bf16 / Float8CurrentScaling / Float8BlockScaling measured bit-exact over two slices
    on a GPU (every shipped TE scenario's two-slice cases); MXFP8 / NVFP4 (no sm_100 GPU
    measured them) and DelayedScaling (a weight not stored quantized is quantized again in the
    backward with a scale the twin has not updated yet) stay calibrated, as do 4 slices."""
    for recipe in ("bf16", "current", "block"):
        assert twin.bitwise(case(mesh, recipe), "te", "cuda")
        assert not twin.calibrated(case(mesh, recipe), "te", "cuda")
        assert twin.calibrated(case("dp4", recipe), "te", "cuda")
    for recipe in ("delayed", "mxfp8", "nvfp4"):
        assert twin.calibrated(case(mesh, recipe), "te", "cuda")


@pytest.mark.parametrize("recipe", RECIPES)
def test_tensor_parallel_keeps_its_split_in_the_twin(recipe):
    """Under TP the twin keeps the case's TP split (dp1xtp<T> over the first slice's TP ranks):
    every recipe has one, bitwise on CPU over two slices (measured: grads, params and loss
    equal on dp2xtp2 and hsdp2x1xtp2), calibrated over more."""
    from harness.distributed.single import twin_ranks, twin_spec
    for mesh in ("dp2xtp2", "hsdp2x1xtp2"):
        assert twin.not_applicable(case(mesh, recipe), "reference", "cpu") is None
        assert twin.bitwise(case(mesh, recipe), "reference", "cpu")
    assert twin.calibrated(case("hsdp2x2xtp2", recipe), "reference", "cpu")
    assert twin_spec(parse_mesh("hsdp2x2xtp2")) == parse_mesh("dp1xtp2")
    assert twin_ranks(parse_mesh("hsdp2x2xtp2")) == [0, 1]
    assert twin_ranks(parse_mesh("dp2xtp4")) == [0, 1, 2, 3]
    assert twin_spec(parse_mesh("dp4")).world_size == 1 and twin_ranks(parse_mesh("dp4")) == [0]


@pytest.mark.parametrize("recipe", ["block", "mxfp8", "nvfp4"])
def test_te_block_formats_have_a_twin_without_fsdp(recipe, monkeypatch):
    """FSDP2 cannot all-gather TE's block-scaled tensors over a one-rank shard dim (the
    registered hsdp*x1 failure): their twin is built without fully_shard."""
    from harness.backends.te_backend import TEBackend
    assert twin.not_applicable(case("dp2", recipe), "te", "cuda") is None
    seen = []
    monkeypatch.setattr(TEBackend, "build", lambda self, *a, fsdp=True: seen.append(fsdp))
    TEBackend().build_twin(case("dp2", recipe), None, None, 1, "cuda")
    TEBackend().build_twin(case("dp2", "current"), None, None, 1, "cuda")
    assert seen == [False, True]


def test_te_delayed_scaling_twin_updates_its_amaxes_once_a_step():
    """TE DelayedScaling reduces its amaxes over the world and updates its scales as an autocast
    region ends (and a backward's first module ends): its twin reduces them over its own ranks
    and runs each slice as a micro-batch whose updates wait for the step's last slice
    (per-slice updates advanced TE's histories once per slice; the whole batch in one forward
    made other GEMM shapes)."""
    from harness.backends import te_global_state
    from harness.backends.te_backend import TEBackend
    from harness.backends.torch_backend import TorchBackend
    c = case("dp2", "delayed")
    assert twin.calibrated(c, "te", "cuda")
    assert TEBackend().twin_amax_group(c) and not TEBackend().twin_amax_group(case("dp2",
                                                                                  "current"))
    assert not TorchBackend().twin_amax_group(c)
    assert twin.calibrated(case("hsdp2x2xtp2", "delayed"), "te", "cuda")

    calls = []

    class Manager:  # TE's FP8GlobalStateManager, as far as the twin's step touches it
        @classmethod
        def reduce_and_update_fp8_tensors(cls, forward=True):
            calls.append(forward)

    with te_global_state.OneUpdatePerStep(Manager) as held:
        for _ in range(3):  # three slices: a forward region's end, then a backward's
            held.next_slice()
            Manager.reduce_and_update_fp8_tensors(forward=True)
            Manager.reduce_and_update_fp8_tensors(forward=False)
        assert calls == []
    assert calls == [True, False]  # once each, forward first, after the last slice
    Manager.reduce_and_update_fp8_tensors(forward=False)
    assert calls == [True, False, False]  # TE's own again
    with pytest.raises(RuntimeError), te_global_state.OneUpdatePerStep(Manager):
        Manager.reduce_and_update_fp8_tensors(forward=True)
        raise RuntimeError("a slice failed")
    assert calls == [True, False, False]  # nothing updated for a step that raised


def test_one_slice_has_no_twin():
    assert "one data-parallel slice" in twin.not_applicable(case("dp1", "bf16"), "torch", "cpu")


def test_packed_parts_come_back_as_views_of_one_buffer():
    parts = (torch.arange(7, dtype=torch.uint8).reshape(7, 1),
             torch.tensor([[1.5, -2.0, 3.25]], dtype=torch.float32),
             torch.arange(6, dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(2, 3))
    (buf,), layout = _pack(parts)
    assert buf.dtype == torch.uint8 and buf.dim() == 1
    assert all(start % 16 == 0 for start, _, _ in layout)
    out = _unpack(buf, layout)
    for a, b in zip(parts, out):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        assert b.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
    buf.zero_()  # FSDP2 frees / refills the buffer: the parts follow it
    assert not out[1].any()


def test_coverage_skips_bitwise_and_twinless_cases():
    from harness.calibration import on_demand
    c = SimpleNamespace(mesh=parse_mesh("dp2"), recipe="current", target=None,
                        checks=("sharding_invariance",))
    assert on_demand.quantities(c, "reference", "cpu") == []
    assert on_demand.quantities(c, "te", "cuda") == []  # bitwise there too
    c.recipe = "nvfp4"  # not measured on a GPU: calibrated
    assert on_demand.quantities(c, "te", "cuda") == [
        ("sharding_invariance", q) for q in sorted(twin.QUANTITIES)]
    c.recipe, c.mesh = "current", parse_mesh("dp2xtp2")
    assert on_demand.quantities(c, "reference", "cpu") == []  # bitwise: the TP split is kept


@pytest.mark.parametrize("check, scenario", [("fp32_parity", "calibration.yaml"),
                                             ("sharding_invariance", "calibration_invariance.yaml")])
def test_a_missing_tolerance_names_the_scenario_that_measures_it(check, scenario):
    from harness.calibration import tolerances
    where = tolerances.Population("reference", "cuda", "gloo", 2, "LayerNormMLP")  # none there
    with pytest.raises(tolerances.MissingTolerance, match=f"scenarios/{scenario}"):
        tolerances.lookup(check, "params", "bf16", where=where)


def test_the_one_rank_group_is_made_by_its_rank_alone_without_splitting_nccl(monkeypatch):
    """Rank 0 makes the twin's group alone: it must not be an NCCL group, which under the
    worker's eagerly initialized NCCL default group is a comm split every rank must join (rank
    0 alone would wait there for good; tests/gpu/test_nccl_ranks_cuda.py runs it on GPUs)."""
    from harness.distributed import single
    calls = []
    monkeypatch.setattr(single, "_MESHES", {})
    monkeypatch.setattr(single.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(single.dist, "new_group",
                        lambda ranks=None, **kw: calls.append((ranks, kw)) or "group")
    monkeypatch.setattr(single.DeviceMesh, "from_group",
                        staticmethod(lambda group, device_type, mesh_dim_names: (group, device_type,
                                                                               mesh_dim_names)))
    assert single.singleton_mesh("cuda", {"shard": "dp_shard"}) == ("group", "cuda", ("dp_shard",))
    assert single.singleton_mesh("cuda", {"shard": "dp_shard"}) == ("group", "cuda", ("dp_shard",))
    assert calls == [([1], {"backend": "gloo", "use_local_synchronization": True})]
