"""Named device meshes: a small grammar from which the world size follows.

    dp4            FSDP over 4 ranks                      dims (dp_shard=4)
    hsdp2x2        HSDP: 2 replicas x 2 shards            dims (dp_replicate=2, dp_shard=2)
    dp2xtp2        FSDP 2 x tensor parallel 2             dims (dp_shard=2, tp=2)
    hsdp2x1xtp2    HSDP 2x1 x tensor parallel 2 (3-D)     dims (dp_replicate=2, dp_shard=1, tp=2)

Only this module knows the grammar; everything else works with :class:`MeshSpec`.
Degrees are validated (>= 1, world size <= MAX_WORLD_SIZE), like torchtitan's ParallelDims.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_WORLD_SIZE = 1024
_GRAMMAR = re.compile(r"^(?:dp(?P<dp>\d+)|hsdp(?P<rep>\d+)x(?P<shard>\d+))(?:xtp(?P<tp>\d+))?$")
GRAMMAR_HELP = "dp<N>, hsdp<R>x<S>, dp<N>xtp<T> or hsdp<R>x<S>xtp<T> (e.g. dp4, hsdp2x2, dp2xtp2, hsdp2x1xtp2)"

# Mesh dimension names, outermost first (the order init_device_mesh receives them).
REPLICATE, SHARD, TP = "dp_replicate", "dp_shard", "tp"


class MeshError(ValueError):
    """A mesh string that does not follow the grammar or has invalid degrees."""


@dataclass(frozen=True)
class MeshSpec:
    name: str
    replicate: int = 1
    shard: int = 1
    tp: int = 1
    hsdp: bool = False  # written as hsdp..., so FSDP gets a 2-D (replicate, shard) mesh

    @property
    def world_size(self) -> int:
        return self.replicate * self.shard * self.tp

    @property
    def dp_size(self) -> int:
        """Ranks that see different data: replicate x shard."""
        return self.replicate * self.shard

    @property
    def dims(self) -> tuple[tuple[str, int], ...]:
        """(name, size) of each device-mesh dimension, outermost first."""
        out = []
        if self.hsdp:
            out.append((REPLICATE, self.replicate))
        out.append((SHARD, self.shard))
        if self.tp > 1:
            out.append((TP, self.tp))
        return tuple(out)

    @property
    def fsdp_dims(self) -> tuple[str, ...]:
        """Mesh dims FSDP2 shards/replicates over (2-D for HSDP)."""
        return (REPLICATE, SHARD) if self.hsdp else (SHARD,)

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates of ``rank`` in the row-major mesh (what init_device_mesh assigns)."""
        coords = {}
        for name, size in reversed(self.dims):
            coords[name] = rank % size
            rank //= size
        return coords

    def dp_index(self, rank: int) -> int:
        """Which data-parallel slice of the global batch ``rank`` consumes."""
        c = self.coords(rank)
        return c.get(REPLICATE, 0) * self.shard + c[SHARD]


def parse_mesh(text: str) -> MeshSpec:
    m = _GRAMMAR.match(str(text))
    if not m:
        raise MeshError(f"bad mesh {text!r}: expected {GRAMMAR_HELP}")
    tp = int(m["tp"] or 1)
    if m["dp"] is not None:
        spec = MeshSpec(str(text), replicate=1, shard=int(m["dp"]), tp=tp, hsdp=False)
    else:
        spec = MeshSpec(str(text), replicate=int(m["rep"]), shard=int(m["shard"]), tp=tp, hsdp=True)
    for name, degree in (("replicate", spec.replicate), ("shard", spec.shard), ("tp", spec.tp)):
        if degree < 1:
            raise MeshError(f"bad mesh {text!r}: {name} degree must be >= 1, got {degree}")
    if m["tp"] is not None and tp < 2:
        raise MeshError(f"bad mesh {text!r}: write no 'xtp' part instead of tp{tp}")
    if spec.world_size > MAX_WORLD_SIZE:
        raise MeshError(f"bad mesh {text!r}: world size {spec.world_size} > {MAX_WORLD_SIZE}")
    return spec
