"""Checks of quantized parameters (reference and te backends). Each runs on every rank after
training (collective) and records rows.

quantized_allgather_parity
    FSDP2's unshard of each quantized weight must (a) be a quantized tensor, i.e. FSDP2 moved raw
    quantized bytes; (b) equal, raw part by raw part, the manual all-gather of the shards' raw
    parts; (c) dequantize to exactly the manual gather of each shard's own dequantized values;
    (d) equal the FP32 gather-then-quantize of the optimizer's master weights. (b)-(d) are
    bitwise: the all-gather moves bytes, and a shard quantized with the group's amax is the slice
    of the whole tensor quantized at once. (e) ``bytes_on_wire``: what FSDP2's all-gather moved
    per parameter (``checks/wire.py``) is the quantized bytes, not dequantized values.
optimizer_state_placement
    every optimizer state tensor of a DTensor parameter is a DTensor on the parameter's mesh with
    the parameter's placements (what DCP needs to reshard it).
weights_only_load
    the quantized shards survive ``torch.save`` -> ``torch.load(weights_only=True)`` (how DCP
    reads checkpoints) with identical raw parts.
"""

from __future__ import annotations

import contextlib
import io

import torch
from torch.distributed.tensor import DTensor

from harness.calibration import tolerances
from harness.checks import wire
from harness.distributed.gather import entries, held
from harness.distributed.run import flatten, full


def _quantized_params(model):
    for name, p in model.named_parameters():
        local = p._local_tensor if isinstance(p, DTensor) else p
        if hasattr(local, "full_parts"):
            yield name, p


def _prefixed(d: dict, name: str) -> dict:
    return {f"{name}#{k}": v for k, v in d.items()}


@contextlib.contextmanager
def unsharded(model):
    """All FSDP2 units of ``model`` unsharded (explicit ``unshard()``, as outside forward);
    yields the unsharded parameters by name, reshards on exit."""
    from torch.distributed.fsdp import FSDPModule
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in units:
        m.unshard()
    try:
        yield dict(model.named_parameters())
    finally:
        for m in units:
            m.reshard()


def quantized_allgather_parity(run, rec) -> None:
    model = run.model
    params = list(_quantized_params(model))
    rec.flag("quantized_allgather_parity", "has_quantized_params", bool(params),
             f"{len(params)} quantized parameters")
    if not params:
        return
    shards = {}
    # each shard dequantized with its own scale, one gather; shards whose regions collide (TP
    # pieces that are no DTensors) leave replicas_diverge entries that the comparison is given
    manual = flatten(dict(params), raw=False)
    for name, p in params:  # (b)/(c) references, from the sharded parameters
        local = p._local_tensor if isinstance(p, DTensor) else p
        master = run.optim.state.get(p, {}).get("master_param")
        whole = master is not None and (isinstance(master, DTensor) or not isinstance(p, DTensor))
        shards[name] = dict(parts=type(local).full_parts(p),
                            master=full(master) if whole else None,
                            quantizer=local._quantizer, codec=local._codec)
    gathered_raw, manual_raw, gathered_deq, manual_deq, violations = {}, {}, {}, {}, []
    with wire.recording() as moved, unsharded(model) as params_now:
        for name, _ in params:
            u = params_now[name]
            u_local = u._local_tensor if isinstance(u, DTensor) else u
            if not hasattr(u_local, "full_parts"):
                violations.append(f"{name}: unsharded parameter is a plain {u_local.dtype} tensor "
                                  f"({u_local.element_size()} bytes/element): FSDP2 gathered "
                                  f"dequantized values, not the quantized bytes")
                continue
            if "row" not in u_local.usages():
                violations.append(f"{name}: unsharded for the forward without rowwise data "
                                  f"(has {sorted(u_local.usages())})")
                continue
            got = type(u_local).full_parts(u)  # the usage FSDP2 gathered (rowwise or both)
            gathered_raw.update(_prefixed(got, name))
            manual_raw.update(_prefixed(entries(shards[name]["parts"], got), name))
            gathered_deq[name] = full(u)
            manual_deq.update(entries(manual, [name]))
    record_wire(rec, moved, [n for n, _ in params], run.case.recipe)
    rec.flag("quantized_allgather_parity", "quantized_unshard", not violations,
             "; ".join(violations) or "every unsharded weight is quantized")
    if violations:
        return
    rec.compare("quantized_allgather_parity", "raw_vs_manual_gather", gathered_raw, manual_raw,
                tolerances.BITWISE)
    rec.compare("quantized_allgather_parity", "dequantized_vs_manual_gather", gathered_deq,
                manual_deq, tolerances.BITWISE)
    fp32_q, ref = {}, {}
    for name, s in shards.items():
        if s["master"] is None or not held(s["master"]):
            continue  # none, or a whole tensor rank 0 holds (distributed/gather.py)
        q = s["codec"].quantize(s["master"].reshape(s["master"].shape[0], -1), {"row", "col"},
                                _whole_tensor_q(s))
        fp32_q.update(_prefixed({k: v for k, v in q.items() if k in s["parts"]}, name))
        ref.update(_prefixed(s["parts"], name))
    if fp32_q:
        rec.compare("quantized_allgather_parity", "vs_fp32_gather_then_quantize", ref, fp32_q,
                    tolerances.BITWISE)


def record_wire(rec, moved: dict, quantized: list[str], recipe: str) -> None:
    """Rows for the bytes FSDP2 moved: a verdict (at most ``recipe``'s bytes per element in a
    data input), and the largest bytes/element (a trace)."""
    bad = wire.violations(moved, quantized, recipe)
    rec.flag("quantized_allgather_parity", "bytes_on_wire", not bad, "; ".join(bad) or "; ".join(
        wire.describe(n, moved[n]) for n in quantized if n in moved))
    worst = max((wire.bytes_per_element(moved[n]) for n in quantized if n in moved), default=0.0)
    rec.measure("quantized_allgather_parity", "bytes_on_wire", "bytes_per_element", worst)


def _whole_tensor_q(s) -> dict:
    """Quantization parameters for the whole (gathered) master weight: the amax of the whole
    tensor (current, nvfp4) or the scale the shards used (delayed: from the history)."""
    from harness.reference.formats import fp8
    recipe, master = s["quantizer"].recipe, s["master"]
    if recipe == "current":
        return {"scale": fp8.scale_from_amax(fp8.amax(master), fp8.E4M3)}
    if recipe == "delayed":
        return {"scale": (1.0 / s["parts"]["scale_inv"].reshape(-1)[0]).reshape(())}
    if recipe == "nvfp4":
        return {"global_amax": fp8.amax(master)}
    return {}


def optimizer_state_placement(run, rec) -> None:
    """Also: every moment / master tensor is fp32 (TE's FusedAdam tests check the dtypes)."""
    bad, checked, dtypes = [], 0, []
    names = {p: n for n, p in run.model.named_parameters()}
    for p, st in run.optim.state.items():
        if not isinstance(p, DTensor):
            continue
        for key, v in st.items():
            if not isinstance(v, torch.Tensor) or v.dim() == 0:
                continue  # step counters are replicated scalars
            checked += 1
            if v.dtype != torch.float32:
                dtypes.append(f"{names.get(p)}.{key}: {v.dtype}")
            if not isinstance(v, DTensor):
                bad.append(f"{names.get(p)}.{key}: plain tensor {tuple(v.shape)} for a DTensor "
                           f"param {tuple(p.shape)} {p.placements}")
            elif v.device_mesh != p.device_mesh or v.placements != p.placements:
                bad.append(f"{names.get(p)}.{key}: {v.placements} != param {p.placements}")
    rec.flag("optimizer_state_placement", "dtensor_states", not bad and checked > 0,
             "; ".join(bad[:4]) or f"{checked} state tensors match their params' placements")
    rec.flag("optimizer_state_placement", "fp32_states", not dtypes,
             "; ".join(dtypes[:4]) or f"{checked} state tensors are fp32")


def weights_only_load(run, rec) -> None:
    saved = {n: (p._local_tensor if isinstance(p, DTensor) else p).detach()
             for n, p in _quantized_params(run.model)}
    buf = io.BytesIO()
    torch.save(saved, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    before = {}
    after = {}
    for n, t in saved.items():
        before.update(_prefixed(t.full_parts(t), n))
        got = loaded[n]
        after.update(_prefixed(got.full_parts(got) if hasattr(got, "full_parts") else {"value": got}, n))
    rec.compare("weights_only_load", "raw_parts", after, before, tolerances.BITWISE)


CHECKS = {"quantized_allgather_parity": quantized_allgather_parity,
          "optimizer_state_placement": optimizer_state_placement,
          "weights_only_load": weights_only_load}
