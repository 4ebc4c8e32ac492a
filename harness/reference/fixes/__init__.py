"""The TransformerEngine fixes the harness is built around, as small toggleable reference code.

Each module here holds one fix: the fixed behaviour and, next to it, the behaviour before the
fix (what TE did before the pull request). A case's ``fixes`` axis turns them on or off:
``all`` (every fix on) or ``no_<name>`` (that one off). With a fix off, the scenario that
exposes its bug must fail (``scenarios/fix_verification.yaml`` + xfail registry entries); with it
on, it passes. That proves each check can catch the bug it is meant to catch.
"""

from __future__ import annotations

FIXES = {
    "tp_dtensor_params": ("TE #2713", "TP-sharded params become DTensors (column Shard(0), row "
                          "Shard(1), norms Replicate); FSDP2 then shards them with _StridedShard"),
    "quantized_allgather": ("TE #2245", "FSDP2 all-gathers the raw "
                            "quantized bytes + scales (rowwise in forward, columnwise in backward)"),
    "optimizer_dtensor_state": ("TE #2795", "optimizer states are DTensors with their param's "
                                "placements"),
    "empty_untyped_storage": ("TE #2974", "QuantizedTensor.untyped_storage() returns an empty "
                              "storage"),
    "to_copy_keeps_subclass": ("TE #2974", ".cpu() / _to_copy / new_empty(device=) move the inner "
                               "buffers without dequantizing"),
    "weights_only_pickle": ("TE #2974", "__reduce_ex__ through module-level reconstructors "
                            "registered with torch.serialization.add_safe_globals"),
    "amax_reduction_group": ("TE #2974", "current-scaling and NVFP4 amax "
                             "reduced over the weight's shard group"),
}
_off: set[str] = set()
_listeners = []  # called after configure() (e.g. to (un)register safe globals)


def configure(spec: str) -> None:
    """``all`` or ``no_<fix>``: set which fixes are on for the next case."""
    global _off
    if spec == "all":
        off = set()
    elif spec.startswith("no_") and spec[3:] in FIXES:
        off = {spec[3:]}
    else:
        raise ValueError(f"fixes={spec!r}: expected 'all' or 'no_<fix>' with fix one of "
                         f"{', '.join(FIXES)}")
    _off = off
    for fn in _listeners:
        fn()


def on(name: str) -> bool:
    if name not in FIXES:
        raise KeyError(name)
    return name not in _off


def axis_values() -> list[str]:
    return ["all"] + [f"no_{n}" for n in FIXES]
