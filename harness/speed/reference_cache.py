"""The FP32 single-process reference, computed once per run for everything that determines it.

Many cases share a reference: every mesh, DCP mode and reshard of one (module, dims, seed,
steps, learning rate) trains the same single-process FP32 model on the same data. ``key``
names everything the reference depends on; rank 0 of the first launch that needs it computes
it and stores it under the run's work directory, every other rank and launch of the run reads
it. A change of any determinant is another key (tests/test_reference_cache.py).

An acceleration (layer ``reference_cache``, speed/layers.py): without it each call is computed
by rank 0 for that call alone, under a file name of its own, removed once every rank read it.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import io
import itertools
import json
import os
from pathlib import Path

import torch

from harness.distributed import data
from harness.speed import layers

_calls = itertools.count()  # plain path: this process's calls, each a file of its own

VERSION = 1  # bump when reference_run or the synthetic data change meaning
TWIN_VERSION = 3  # bump when single_rank_run changes meaning


def determinants(case, backend, device, lr_scale: float, twin: bool = False) -> dict:
    """``twin``: the one-rank twin of the case's own recipe (distributed/single.py) -- it also
    depends on the recipe, the data-parallel slicing and every axis but the mesh, DCP mode and
    reshard (fixes, mutations, faults change what is built or how it steps)."""
    ref = getattr(case, "model_ref", None)  # a scenario's own model: its factory, plan, task
    extra = {}
    if twin:
        extra = dict(twin=TWIN_VERSION, recipe=case.recipe, dp=case.mesh.dp_size, tp=case.mesh.tp,
                     axes={k: v for k, v in sorted(case.ax.items())
                           if k not in ("mesh", "dcp", "reshard")})
    return dict(extra, version=VERSION, data=data.VERSION, backend=backend.name,
                module=case.ax["module"], model_ref=repr(ref) if ref is not None else None,
                model=dataclasses.asdict(case.model),
                seed=case.train.seed, steps=case.train.steps, lr=case.train.lr,
                lr_scale=lr_scale, device=str(torch.device(device).type),
                dtype="case" if twin else "float32", torch=torch.__version__,
                library=backend.versions())


def key(case, backend, device, lr_scale: float, twin: bool = False) -> str:
    blob = json.dumps(determinants(case, backend, device, lr_scale, twin), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def store(value, path: Path) -> None:
    """``value`` saved to ``path`` (atomic). Serialized in memory, then written as plain bytes:
    ``torch.save`` straight to a full disk fails as ``RuntimeError('[enforce fail at
    inline_container.cc:672] . unexpected pos 128 vs 0')``; this says ENOSPC and names the
    directory."""
    buf = io.BytesIO()
    torch.save(value, buf)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(buf.getbuffer())
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(e.errno, f"no space left on device in {path.parent} (the work "
                                   f"directory's cache of FP32 reference and one-rank twin "
                                   f"runs)") from None
        raise


def cached(cache_dir: Path, k: str, compute, ctx, ranks: tuple[int, ...] = (0,)) -> tuple:
    """The reference under key ``k``: read from ``cache_dir`` or computed by ``ranks`` (rank 0
    alone, or the TP twin's ranks together; rank 0's value) and written there by rank 0
    (atomic); collective over the exchange group. They compute it in the library's global
    state of their own (``backend.isolated``): a run some ranks make alone must neither meet
    the case's state nor join a collective of the case's group."""
    import torch.distributed as dist
    path = Path(cache_dir) / f"{k}.pt"
    plain = not layers.active("reference_cache")  # computed for this call alone, then removed
    if plain:
        path = path.with_name(f"{k}.{os.getpid()}-{next(_calls)}.pt")  # rank 0's name is sent
    need = [ctx.rank == 0 and (plain or not path.is_file()), str(path)]  # rank 0 decides
    dist.broadcast_object_list(need, src=0, group=ctx.exchange)
    err = None
    if need[0] and ctx.rank in ranks:
        try:
            with ctx.backend.isolated():
                value = compute()
            if ctx.rank == 0:
                store(value, path)
        except Exception as e:  # noqa: BLE001 - every rank raises it below
            err = str(e) if isinstance(e, OSError) else repr(e)
    if need[0]:  # every rank knows whether some computed: a cache hit makes one collective
        errs = [None] * ctx.world_size
        dist.all_gather_object(errs, err, group=ctx.exchange)
        failed = next(((r, e) for r, e in enumerate(errs) if e is not None), None)
        if failed is not None:
            raise RuntimeError(f"the cached run failed on rank {failed[0]}: {failed[1]}")
    value = tuple(torch.load(need[1], weights_only=True))
    if plain:
        dist.barrier(group=ctx.exchange)  # every rank has read it
        if ctx.rank == 0:
            Path(need[1]).unlink(missing_ok=True)
    return value
