import pytest

from harness.spec.mesh import MeshError, parse_mesh


@pytest.mark.parametrize("text, world, dims", [
    ("dp4", 4, (("dp_shard", 4),)),
    ("dp1", 1, (("dp_shard", 1),)),
    ("hsdp2x2", 4, (("dp_replicate", 2), ("dp_shard", 2))),
    ("dp2xtp2", 4, (("dp_shard", 2), ("tp", 2))),
    ("hsdp2x1xtp2", 4, (("dp_replicate", 2), ("dp_shard", 1), ("tp", 2))),
    ("hsdp2x2xtp2", 8, (("dp_replicate", 2), ("dp_shard", 2), ("tp", 2))),
])
def test_parse(text, world, dims):
    m = parse_mesh(text)
    assert m.world_size == world
    assert m.dims == dims
    assert m.name == text


@pytest.mark.parametrize("text, msg", [
    ("dp", "expected dp<N>"),
    ("tp2", "expected dp<N>"),
    ("dp2xtp", "expected dp<N>"),
    ("hsdp2", "expected dp<N>"),
    ("dp0", "shard degree must be >= 1"),
    ("hsdp0x2", "replicate degree must be >= 1"),
    ("dp2xtp1", "write no 'xtp' part"),
    ("dp2048", "world size 2048 > 1024"),
    ("DP2", "expected dp<N>"),
])
def test_bad(text, msg):
    with pytest.raises(MeshError, match="bad mesh") as e:
        parse_mesh(text)
    assert msg in str(e.value)


def test_coords_row_major_like_init_device_mesh():
    m = parse_mesh("hsdp2x2xtp2")
    assert m.coords(0) == {"dp_replicate": 0, "dp_shard": 0, "tp": 0}
    assert m.coords(1) == {"dp_replicate": 0, "dp_shard": 0, "tp": 1}
    assert m.coords(2) == {"dp_replicate": 0, "dp_shard": 1, "tp": 0}
    assert m.coords(7) == {"dp_replicate": 1, "dp_shard": 1, "tp": 1}


def test_dp_index_shared_by_tp_ranks_and_covers_all_slices():
    m = parse_mesh("hsdp2x2xtp2")
    idx = [m.dp_index(r) for r in range(m.world_size)]
    assert idx == [0, 0, 1, 1, 2, 2, 3, 3]
    assert parse_mesh("dp4").fsdp_dims == ("dp_shard",)
    assert parse_mesh("hsdp2x2").fsdp_dims == ("dp_replicate", "dp_shard")
