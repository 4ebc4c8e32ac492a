"""The bundled port of TE PR #2713's set_device_mesh (harness/backends/te_tp), without TE or a
GPU: the placement rules, the port applied to stand-ins with TE's parameter names and
``parallel_mode`` / ``tp_size`` attributes on a fake world (alone and under FSDP2), and each
piece's switch. TE's own classes are exercised on GPU (scenarios fsdp2_tp_dcp, te_mutations)."""

import inspect
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from harness.backends import te_tp
from harness.backends.te_tp import (
    allgather_out,
    amax_group,
    block_storage,
    dtensor_params,
    port,
)
from harness.backends.te_tp.placements import module_placements, placement, table

H, FFN, TP = 8, 16, 2


@pytest.fixture
def tp_mesh(fake_world):
    fake_world(TP)
    return init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))


# --- stand-ins: TE's parameter names and TP attributes, TP-local shapes ---------------------
class Linear(nn.Module):
    def __init__(self, parallel_mode="column", tp_size=TP):
        super().__init__()
        self.parallel_mode, self.tp_size = parallel_mode, tp_size
        rows = H // tp_size if parallel_mode == "column" else H
        cols = H // tp_size if parallel_mode == "row" else H
        self.weight = nn.Parameter(torch.randn(rows, cols))
        self.bias = nn.Parameter(torch.randn(rows))
        self.seen = []

    def forward(self, x):
        self.seen.append(self.weight)
        assert not isinstance(self.weight, DTensor), "TE's kernels take plain tensors"
        return F.linear(x, self.weight, self.bias)


class LayerNormMLP(nn.Module):
    def __init__(self, tp_size=TP):
        super().__init__()
        self.tp_size = tp_size
        self.layer_norm_weight = nn.Parameter(torch.ones(H))
        self.layer_norm_bias = nn.Parameter(torch.zeros(H))
        self.fc1_weight = nn.Parameter(torch.randn(FFN // tp_size, H))
        self.fc1_bias = nn.Parameter(torch.randn(FFN // tp_size))
        self.fc2_weight = nn.Parameter(torch.randn(H, FFN // tp_size))
        self.fc2_bias = nn.Parameter(torch.randn(H))

    def forward(self, x):
        ps = [p for _, p in self.named_parameters()]
        assert not any(isinstance(p, DTensor) for p in ps), "TE's kernels take plain tensors"
        h = F.layer_norm(x, (H,), self.layer_norm_weight, self.layer_norm_bias)
        h = F.gelu(F.linear(h, self.fc1_weight, self.fc1_bias))
        return F.linear(h, self.fc2_weight) + self.fc2_bias


# --- (a) placement rules ---------------------------------------------------------------------
@pytest.mark.parametrize("cls, mode, name, want", [
    ("Linear", "column", "weight", Shard(0)), ("Linear", "column", "bias", Shard(0)),
    ("Linear", "row", "weight", Shard(1)), ("Linear", "row", "bias", Replicate()),
    ("Linear", None, "weight", Replicate()), ("Linear", "column", "query_weight", Shard(0)),
    ("LayerNormLinear", "column", "weight", Shard(0)),
    ("LayerNormLinear", "column", "layer_norm_weight", Replicate()),
    ("LayerNormLinear", "column", "layer_norm_bias", Replicate()),
    ("LayerNormMLP", None, "fc1_weight", Shard(0)), ("LayerNormMLP", None, "fc1_bias", Shard(0)),
    ("LayerNormMLP", None, "fc2_weight", Shard(1)), ("LayerNormMLP", None, "fc2_bias", Replicate()),
    ("LayerNormMLP", None, "layer_norm_weight", Replicate()),
    ("LayerNorm", None, "weight", Replicate()), ("RMSNorm", None, "weight", Replicate()),
    ("DotProductAttention", None, "softmax_offset", Shard(0)),
    ("MultiheadAttention", None, "layernorm_qkv.weight", Shard(0)),
    ("MultiheadAttention", None, "layernorm_qkv.layer_norm_weight", Replicate()),
    ("MultiheadAttention", None, "proj.weight", Shard(1)),
    ("MultiheadAttention", None, "proj.bias", Replicate()),
    ("MultiheadAttention", None, "core_attention.softmax_offset", Shard(0)),
    ("TransformerLayer", None, "self_attention.qkv.bias", Shard(0)),
    ("TransformerLayer", None, "self_attention.proj.weight", Shard(1)),
    ("TransformerLayer", None, "layernorm_mlp.fc2_weight", Shard(1)),
    ("TransformerLayer", None, "layernorm.weight", Replicate()),
])
def test_placement_rules(cls, mode, name, want):
    assert placement(cls, mode, name) == want


@pytest.mark.parametrize("cls, mode, name", [
    ("GroupedLinear", None, "weight0"),  # not in the PR
    ("LayerNormMLP", None, "fc3_weight"), ("Linear", "diagonal", "weight"),
    ("MultiheadAttention", None, "rotary.weight"), ("TransformerLayer", None, "layernorm_mlp"),
])
def test_unknown_parameters_are_errors(cls, mode, name):
    with pytest.raises(ValueError):
        placement(cls, mode, name)


def test_rules_agree_with_the_reference_backend():
    """The reference backend's own #2713 (fixes/tp_dtensor_params.py) places its TE-named
    parameters the same way: one set of rules, two backends."""
    from harness.reference import modules as ref
    from harness.reference.fixes.tp_dtensor_params import PLACEMENT
    for cls, mode in (("Linear", "column"), ("LayerNormLinear", "column"),
                      ("LayerNormMLP", None)):
        for name, (_, kind, _) in getattr(ref, cls).PARAMS.items():
            assert placement(cls, mode, name) == PLACEMENT[kind], (cls, name)
    assert len(table()) == 6 + 12 + 6 + 4 + 1


# --- (b) applied to stand-ins ----------------------------------------------------------------
def test_port_makes_dtensor_params_and_forward_still_works(tp_mesh):
    m = LayerNormMLP()
    local = {n: p.detach().clone() for n, p in m.named_parameters()}
    assert port.set_device_mesh(m, tp_mesh) == te_tp.BUNDLED
    got = {n: p.placements for n, p in m.named_parameters()}
    assert got == {n: (pl,) for n, pl in module_placements(m).items()}
    assert got["fc1_weight"] == (Shard(0),) and got["fc2_weight"] == (Shard(1),)
    assert got["fc2_bias"] == (Replicate(),) and got["layer_norm_weight"] == (Replicate(),)
    assert m.fc1_weight.shape == (FFN, H) and m.fc2_weight.shape == (H, FFN)  # whole tensors
    assert all(torch.equal(p.to_local(), local[n]) for n, p in m.named_parameters())
    x = torch.randn(2, 3, H)
    y = m(x)
    assert y.shape == (2, 3, H) and isinstance(m.fc1_weight, DTensor)  # restored after forward
    y.sum().backward()
    assert m.fc2_weight.grad.placements == (Shard(1),)
    assert m.fc2_weight.grad.to_local().shape == (H, FFN // TP)


def test_forward_sees_the_local_tensor_object(tp_mesh):
    m = Linear()
    port.set_device_mesh(m, tp_mesh)
    m(torch.randn(2, H))
    assert m.seen[-1] is m.weight._local_tensor
    undo = te_tp.switch_off("local_identity")
    try:
        m(torch.randn(2, H))
    finally:
        undo()
    assert m.seen[-1] is not m.weight._local_tensor  # a to_local() alias
    assert torch.equal(m.seen[-1], m.weight._local_tensor)


def test_dtensor_params_off_leaves_plain_tp_shards(tp_mesh):
    undo = te_tp.switch_off("dtensor_params")
    try:
        m = Linear(parallel_mode="row")
        port.set_device_mesh(m, tp_mesh)
    finally:
        undo()
    assert te_tp.on("dtensor_params")
    assert not any(isinstance(p, DTensor) for p in m.parameters())
    assert m(torch.randn(2, H // TP)).shape == (2, H)


def test_fsdp2_shards_the_port_placements_again(fake_world):
    """FSDP2 answers the port's TP placements with _StridedShard (dim-0 TP shards) -- what DCP
    needs; the forward under FSDP2's hooks still gets plain tensors, and grads are DTensors."""
    fake_world(4)
    mesh = init_device_mesh("cpu", (2, TP), mesh_dim_names=("dp_shard", "tp"))
    m = LayerNormMLP()
    port.set_device_mesh(m, mesh["tp"])
    fully_shard(m, mesh=mesh["dp_shard"])
    pl = {n: p.placements for n, p in m.named_parameters()}
    assert pl["fc1_weight"] == (_StridedShard(0, split_factor=2), Shard(0))
    assert pl["fc2_weight"] == (Shard(0), Shard(1))
    assert pl["fc2_bias"] == (Shard(0), Replicate())
    m(torch.randn(2, 3, H)).sum().backward()
    assert m.fc1_weight.grad.placements == pl["fc1_weight"]
    plain = LayerNormMLP()
    undo = te_tp.switch_off("dtensor_params")
    try:
        port.set_device_mesh(plain, mesh["tp"])
    finally:
        undo()
    fully_shard(plain, mesh=mesh["dp_shard"])
    assert plain.fc1_weight.placements == (Shard(0),)  # TE before the PR: no TP dim at all


def test_tp_local_full_slices_plain_shards_only(tp_mesh):
    m = LayerNormMLP()
    full = {"fc1_weight": torch.randn(FFN, H), "fc2_weight": torch.randn(H, FFN),
            "fc1_bias": torch.randn(FFN), "fc2_bias": torch.randn(H),
            "layer_norm_weight": torch.randn(H), "other._extra_state": torch.zeros(3)}
    out = dtensor_params.tp_local_full(m, full, tp_rank=1, tp_size=TP)
    assert torch.equal(out["fc1_weight"], full["fc1_weight"][FFN // 2:])
    assert torch.equal(out["fc2_weight"], full["fc2_weight"][:, FFN // 2:])
    assert out["fc2_bias"] is full["fc2_bias"] and out["layer_norm_weight"] is full["layer_norm_weight"]
    port.set_device_mesh(m, tp_mesh)  # DTensors: whole shapes, nothing to cut
    assert all(v is full[k] for k, v in dtensor_params.tp_local_full(m, full, 1, TP).items())


def test_tp_size_must_match_the_mesh(tp_mesh):
    with pytest.raises(ValueError, match="tp_size=4"):
        port.set_device_mesh(Linear(tp_size=4), tp_mesh)


def test_native_set_device_mesh_is_used_where_te_has_it(tp_mesh):
    class Native(Linear):
        def set_device_mesh(self, tp_mesh=None, weight_mesh=None):
            self.called = (tp_mesh, weight_mesh)
    m = Native()
    assert port.set_device_mesh(m, tp_mesh, weight_mesh="a process group") == te_tp.NATIVE
    assert m.called == (tp_mesh, None) and not isinstance(m.weight, DTensor)
    assert te_tp.tp_support(SimpleNamespace(Linear=Native)) == te_tp.NATIVE
    assert te_tp.tp_support(SimpleNamespace(Linear=Linear)) == te_tp.BUNDLED


# --- (c) - (e) on stand-ins of TE's tensor classes and quantizers ------------------------------
class FakeQuantized:
    def fsdp_pre_all_gather(self, mesh, orig_size, contiguous_orig_stride, module, mp_policy):
        self.amax_reduction_group = mesh  # TE 2.20.2: FSDP2's mesh group, per tensor
        return (), None

    def fsdp_post_all_gather(self, outputs, metadata, param_dtype, *, out=None):
        return out, outputs


def test_allgather_out_unwraps_fsdp2s_dtensor(tp_mesh):
    out = DTensor.from_local(torch.zeros(2), tp_mesh, [Shard(0)], run_check=False)
    undo = allgather_out.install([FakeQuantized])
    try:
        assert FakeQuantized().fsdp_post_all_gather((), None, None, out=out)[0] is out._local_tensor
        off = te_tp.switch_off("allgather_out")
        assert FakeQuantized().fsdp_post_all_gather((), None, None, out=out)[0] is out
        off()
    finally:
        undo()
    assert FakeQuantized().fsdp_post_all_gather((), None, None, out=out)[0] is out


class TEStorage:
    def untyped_storage(self):
        return "TE's 0-byte storage"


class FakeBlockwise(TEStorage):
    device = torch.device("cpu")

    def __init__(self, rowwise=None, columnwise=None):
        self._rowwise_data, self._columnwise_data = rowwise, columnwise


def test_block_storage_is_the_datas_or_one_byte():
    col = torch.zeros(4)
    with port.class_patches(([FakeQuantized], [FakeBlockwise])):
        assert FakeBlockwise(None, col).untyped_storage().data_ptr() == col.untyped_storage().data_ptr()
        empty = FakeBlockwise()
        assert empty.untyped_storage().nbytes() == 1
        assert empty.untyped_storage() is empty.untyped_storage()
        undo = te_tp.switch_off("block_storage")
        assert empty.untyped_storage() == "TE's 0-byte storage"
        undo()
    assert "untyped_storage" not in FakeBlockwise.__dict__  # the patch is gone after the case


class Float8CurrentScalingQuantizer:
    def __init__(self):
        self.with_amax_reduction, self.amax_reduction_group = False, None


class QuantizedLinear(Linear):
    """Linear whose reset_parameters quantizes the weight like TE 2.20.2's: amax over the
    DTensor's 'shard' group."""
    def __init__(self):
        super().__init__()
        self.param_init_meta = {"weight": SimpleNamespace(fp8_meta_index=1),
                                "bias": SimpleNamespace(fp8_meta_index=None)}
        self.quantizers = {"scaling_fwd": [None, Float8CurrentScalingQuantizer()]}

    def reset_parameters(self, defer_init=False):
        if defer_init:
            return
        q = self.quantizers["scaling_fwd"][1]
        q.with_amax_reduction, q.amax_reduction_group = True, "mesh['shard'] group"
        self.weight._local_tensor._quantizer = Float8CurrentScalingQuantizer()
        self.weight._local_tensor._quantizer.amax_reduction_group = "mesh['shard'] group"


@pytest.mark.parametrize("piece_on", [True, False])
def test_amax_group_is_the_weight_meshs(tp_mesh, piece_on):
    m = QuantizedLinear()
    port.set_device_mesh(m, tp_mesh, weight_mesh="shard x tp group")
    undo = (lambda: None) if piece_on else te_tp.switch_off("amax_group")
    try:
        m.reset_parameters()
    finally:
        undo()
    want = "shard x tp group" if piece_on else "mesh['shard'] group"
    assert m.quantizers["scaling_fwd"][1].amax_reduction_group == want
    assert m.weight._local_tensor._quantizer.amax_reduction_group == want
    assert m.weight._local_tensor._quantizer.with_amax_reduction is piece_on
    assert amax_group.apply(Linear()) == 0  # a module the port did not configure


def test_a_missing_te_attribute_names_the_piece(tp_mesh):
    class Moved:  # a TE class whose hooks moved
        pass
    with pytest.raises(te_tp.PortError, match="piece 'allgather_out'.*Moved"):
        allgather_out.install([Moved])
    with pytest.raises(te_tp.PortError, match="piece 'block_storage'"):
        block_storage.storage(SimpleNamespace(device=torch.device("cpu")))


def test_mutants_switch_the_pieces():
    from harness.backends import te_mutations
    from harness.spec import catalog
    for piece in te_tp.PIECES:
        name = f"no_tp_{piece}"
        assert name in catalog.MUTATIONS
        with te_mutations.applied(name):
            assert not te_tp.on(piece)
        assert te_tp.on(piece)


# --- the te backend's wiring, with a stand-in for TE ------------------------------------------
class TEStandIn(Linear):
    """te.Linear's constructor signature, TP-local like TE's."""
    def __init__(self, in_features, out_features, parallel_mode=None, tp_group=None,
                 tp_size=1, params_dtype=torch.float32, device="cpu"):
        nn.Module.__init__(self)
        self.parallel_mode, self.tp_size, self.tp_group = parallel_mode, tp_size, tp_group
        rows = out_features // tp_size if parallel_mode == "column" else out_features
        self.weight = nn.Parameter(torch.randn(rows, in_features))
        self.bias = nn.Parameter(torch.randn(rows))
        self.seen = []

    def set_tensor_parallel_group(self, group):
        self.tp_group = group



def test_te_backend_builds_tp_modules_through_the_port(fake_world, monkeypatch):
    from harness.backends import te_backend
    from harness.backends.te_modules import make
    from harness.distributed import parallel
    from harness.spec.mesh import parse_mesh
    from harness.spec.scenario import ModelDims
    fake_world(4)
    spec = parse_mesh("dp2xtp2")
    mesh = parallel.device_mesh(spec, "cpu")
    te = SimpleNamespace(Linear=TEStandIn, is_fp8_available=lambda return_reason: (True, ""))
    case = SimpleNamespace(model=ModelDims(hidden=H, out_features=H), ax={"module": "Linear"},
                           model_ref=None, recipe="current", mesh=spec, target=None)
    m = make(te, case, "te", "cpu", mesh, spec)
    assert m.weight.placements == (Shard(0),) and m.weight.shape == (H, H)
    assert m.tp_group is mesh["tp"].get_group()
    assert m(torch.randn(2, H)).shape == (2, H)  # the column-parallel output gathered over TP
    monkeypatch.setattr(te_backend, "_import", lambda: (te, "2.20.2", None))
    backend = te_backend.TEBackend()
    # TP cases run (through the port), at dims TE's FP8 GEMMs take (multiples of 16 a TP rank)
    wide = SimpleNamespace(**{**vars(case), "model": ModelDims(hidden=64, out_features=64)})
    assert backend.skip_reason(wide, "cuda") is None
    assert "weight weight [4 x 8] per TP rank" in backend.skip_reason(case, "cuda")
    assert backend.versions() == {"te": "2.20.2", "te_tp": te_tp.BUNDLED}
    assert te_tp.BUNDLED in backend.case_notes(case)["te_tp"]
    assert backend.case_notes(SimpleNamespace(mesh=parse_mesh("dp2"), target=None)) == {}


@pytest.mark.parametrize("piece_on", [True, False])
def test_amax_group_outlives_tes_per_tensor_override(tp_mesh, piece_on):
    """TE's fsdp_pre_all_gather sets the shard's tensor-level group to FSDP2's mesh group at
    every all-gather; the port's wrapper puts the weight group back (it is what quantize_
    reduces over when FusedAdam writes the master weights back)."""
    m = QuantizedLinear()
    weights = "shard x tp group"
    port.set_device_mesh(m, tp_mesh, weight_mesh=weights)
    m.reset_parameters()
    unit = torch.nn.Sequential(m)  # the FSDP2 unit holding the configured TE module
    shard = FakeQuantized()
    undo = (lambda: None) if piece_on else te_tp.switch_off("amax_group")
    try:
        with port.class_patches(([FakeQuantized], [FakeBlockwise])):
            shard.fsdp_pre_all_gather("FSDP2's mesh group", None, None, unit, None)
    finally:
        undo()
    assert shard.amax_reduction_group == (weights if piece_on else "FSDP2's mesh group")
    other = FakeQuantized()  # a unit with no module the port configured
    with port.class_patches(([FakeQuantized], [FakeBlockwise])):
        other.fsdp_pre_all_gather("FSDP2's mesh group", None, None, torch.nn.Linear(2, 2), None)
    assert other.amax_reduction_group == "FSDP2's mesh group"
    assert "fsdp_pre_all_gather" in FakeQuantized.__dict__  # the class's own, restored
    assert not getattr(FakeQuantized.fsdp_pre_all_gather, amax_group._MARK, False)
    # FSDP2 accepts only the hook's exact signature (torch checks the parameter names)
    with port.class_patches(([FakeQuantized], [FakeBlockwise])):
        params = list(inspect.signature(FakeQuantized.fsdp_pre_all_gather).parameters)
    assert params == ["self", "mesh", "orig_size", "contiguous_orig_stride", "module",
                      "mp_policy"]
