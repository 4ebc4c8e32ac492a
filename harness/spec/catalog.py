"""What the harness knows: axis values, backends, recipes and checks.

Validation (``spec``), matrix expansion (``matrix``) and the worker all read these tables,
so an unknown value is rejected in one place with one list of what is allowed.
"""

from __future__ import annotations

BACKENDS = ("torch", "reference", "te")
DEFAULT_BACKEND = "torch"

# The TE fixes the reference backend carries, each as a small toggleable module in
# harness/reference/fixes/: name -> (pull request, what the fix does). The fixes axis takes
# ``all`` or ``no_<name>``.
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
    "partial_slice_view": ("no TE PR (TE 2.20.2 lacks it)", "a partial slice of a block, MXFP8 "
                           "or NVFP4 tensor is a view of its blocks: DCP's load writes into it"),
}
FIX_AXIS_VALUES = ["all"] + [f"no_{n}" for n in FIXES]

# recipe -> one-line meaning. A backend supports a subset (RECIPES_BY_BACKEND).
RECIPES = {
    "fp32": "fp32 params and compute",
    "bf16": "FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)",
    "delayed": "FP8 per-tensor delayed scaling (amax history)",
    "current": "FP8 per-tensor current scaling",
    "block": "FP8 block scaling (1x128 activations, 128x128 weights)",
    "mxfp8": "MXFP8: 1x32 blocks, E8M0 scales",
    "nvfp4": "NVFP4: E2M1, 16-element blocks, E4M3 block scales, fp32 global scale",
}
QUANTIZED_RECIPES = ("delayed", "current", "block", "mxfp8", "nvfp4")
RECIPES_BY_BACKEND = {
    "torch": ("fp32", "bf16"),
    "reference": ("fp32", "bf16") + QUANTIZED_RECIPES,
    "te": ("bf16",) + QUANTIZED_RECIPES,
}

MODULES = ("Linear", "LayerNormLinear", "LayerNormMLP", "MultiheadAttention", "TransformerLayer",
           "LlamaStack")
#: the model dims each built-in module builds with, which a TP mesh must divide (a Linear has no
#: heads or vocabulary: a tp3 mesh needs no vocab divisible by 3 there)
TP_DIMS = {"Linear": ("hidden", "out_features"), "LayerNormLinear": ("hidden", "out_features"),
           "LayerNormMLP": ("hidden", "ffn"), "MultiheadAttention": ("hidden", "heads"),
           "TransformerLayer": ("hidden", "ffn", "heads"),
           "LlamaStack": ("hidden", "ffn", "heads", "vocab")}

# What a module is trained on: its inputs, targets and loss (harness/distributed/data.py). A module
# axis value names a built-in module (MODULE_TASKS) or a model a scenario or an installed
# package brings (harness/spec/models.py; its ``task``, default ``regression``).
TASKS = {
    "regression": "float inputs [batch, seq, hidden] -> [batch, seq, hidden], MSE loss",
    "projection": "float inputs [batch, seq, hidden] -> [batch, seq, out_features], MSE loss",
    "next_token": "token ids [batch, seq] in [0, vocab) -> logits [batch, seq, vocab], "
                  "cross-entropy with the next token",
}
MODULE_TASKS = {"Linear": "projection", "LayerNormLinear": "projection",
                "LayerNormMLP": "regression", "MultiheadAttention": "regression",
                "TransformerLayer": "regression", "LlamaStack": "next_token"}
# The loss each task trains with. Calibrated tolerances are measured per loss: a next-token
# model's errors (a whole model: embedding, layers, a head over the vocabulary) are not a
# single layer's under MSE (harness/calibration, harness/calibration/tolerances.py).
TASK_LOSS = {"regression": "mse", "projection": "mse", "next_token": "cross_entropy"}
# Entry-point group through which an installed package adds module axis values
# (harness/spec/models.py): name -> {factory, tp_plan, task}.
MODULE_ENTRY_POINTS = "harness.modules"

DCP_MODES = {
    "sync": "torch.distributed.checkpoint.save",
    "async_thread": "dcp.async_save, AsyncCheckpointerType.THREAD",
    "async_process": "dcp.async_save, AsyncCheckpointerType.PROCESS",
}

# check -> what it proves. Checks not applicable to a case (e.g. reshard with reshard=none)
# are not run for it; "applies" below says when a check runs.
CHECKS = {
    "fp32_parity": "per-step loss and final params vs a single-process FP32 reference",
    "sharding_invariance": "per-step loss, first grads and final params bit for bit vs the "
    "same recipe and module on one rank, each data-parallel slice a micro-batch",
    "dcp_roundtrip": "save -> load into a fresh model/optimizer on the same mesh is bitwise, "
    "and the next step equals the uninterrupted run's",
    "async_equivalence": "an async checkpoint holds the same bytes as the sync one of the same "
    "state, even when training mutates the state right after async_save returns",
    "reshard": "save on mesh A, load on mesh B (another world size): full state bitwise, next "
    "step within tolerance of the uninterrupted run",
    "quantized_allgather_parity": "FSDP2 unshard of quantized params vs manual gather of "
    "dequantized shards and vs FP32 gather-then-quantize",
    "optimizer_state_placement": "every optimizer state is a DTensor with its param's mesh and "
    "placements",
    "weights_only_load": "torch.load(weights_only=True) of a torch.save'd quantized state",
    "safetensors_export": "the FP32 safetensors export is all fp32, equals the master weights "
    "of the checkpointed state bit for bit and the quantized weights within one rounding",
    "tied_weights": "parameters the module ties (e.g. an LM head and its embedding) stay one "
    "tensor after training, after a load and after resharding: same object and storage, equal "
    "values, exactly one optimizer state",
}
# Checks with a part that runs in the reshard phase (on the target mesh).
RESHARD_PHASE_CHECKS = ("tied_weights", "reshard")
DEFAULT_CHECKS = ("fp32_parity", "sharding_invariance", "dcp_roundtrip", "async_equivalence",
                  "reshard")

# What makes the artifacts checks need (harness/worker/producers.py), in the order they run.
# A failure of one is reported under its name, like a check's; "case" is a launch-level
# failure (timeout, crash, an error outside every producer and check).
PRODUCERS = {
    "train": "build, shard and train the model",
    "reference": "the single-process FP32 reference run",
    "single_rank": "the case's recipe and module on one rank (sharding invariance)",
    "export": "write the FP32 safetensors export of the trained model",
    "save": "capture the state, save it with DCP, run the next step",
    "load": "a fresh model + optimizer on the same mesh, loaded from the checkpoint",
    "expected": "reshard phase: read what the train phase saved",
    "reshard_load": "a fresh model + optimizer on the target mesh, loaded from the checkpoint",
}
UNITS = tuple(PRODUCERS) + tuple(CHECKS) + ("case",)
# The quantities each check reports (a row's ``quantity``; globs where a name is built, e.g.
# a tied group's label). Every unit also reports "error" (it raised) and "time"; producers and
# "case" name theirs freely (a backend's notes). An xfail entry naming a quantity a check never
# reports could never match: refused at load (tests/test_registry.py checks this list against
# what harness/checks reports).
CHECK_QUANTITIES = {
    "fp32_parity": ("loss", "grads", "params", "stored_params", "update_norms",
                    "params_updated"),
    "sharding_invariance": ("loss", "grads", "params", "stored_params"),
    "dcp_roundtrip": ("state", "cached_buffers", "rebuilt_buffers", "next_loss", "next_params"),
    "async_equivalence": ("bytes", "isolation"),
    "reshard": ("state", "next_loss", "next_params"),
    "quantized_allgather_parity": ("has_quantized_params", "shards_share_scale",
                                   "quantized_unshard", "dequantized_vs_manual_gather",
                                   "raw_vs_manual_gather", "raw_not_compared",
                                   "vs_fp32_gather_then_quantize", "bytes_on_wire"),
    "optimizer_state_placement": ("dtensor_states", "fp32_states"),
    "weights_only_load": ("raw_parts", "rebuilt_buffers"),
    "safetensors_export": ("fp32_dtypes", "in_state", "vs_state", "vs_quantized"),
    "tied_weights": ("has_tied_weights", "*.same_tensor", "*.values", "*.optimizer"),
}
EVERY_UNIT_QUANTITIES = ("error", "time", "workaround")
RESHARD_PRODUCERS = ("expected", "reshard_load")  # the reshard phase's
# the quantity of the note a case gets whose train phase another case's train task ran
# (harness/launch/task_graph.py): its train-phase rows are that training's, counted once
SHARED_TRAIN_PHASE = "shared_train_phase"
# the note of a DCP mode that took over its group's first case's train-phase rows, and of one
# that trained its own run after all (worker/mode_group.py)
MODE_GROUP, MODE_GROUP_OWN = "mode_group", "mode_group_own_run"

# Axes every scenario has, in id order. Extra axes (e.g. 'fixes', 'fault') follow them.
CORE_AXES = ("recipe", "mesh", "module", "dcp", "reshard")
RESHARD_NONE = "none"
RESHARD_PREFIX = "to_"

# Fault injections, for the harness's negative controls only (tests/). Each makes one check
# fail or one case hang; the worker implements them in distributed/faults.py.
FAULTS = {
    "none": "no fault",
    "perturb_loaded": "add 1e-3 to one element of one loaded parameter",
    "skip_load": "do not load the checkpoint into the fresh model",
    "perturb_reference": "scale the FP32 reference's learning rate by 1.01",
    "hang": "rank 1 sleeps far past the case timeout",
    "crash": "rank 1 exits with code 3 in the middle of the case",
    "raise": "rank 0 raises RuntimeError while training",
    "check_raises": "fp32_parity raises on every rank (later checks must still run)",
    "drop_columnwise_on_load": "the load leaves the first quantized weight without its "
    "columnwise data (reference backend)",
    # sized bugs: each as small as a real regression, and each must fail its check
    "lr_scale_1.5": "the run under test steps with 1.5x the reference's learning rate",
    "lr_scale_0.67": "the run under test steps with 0.67x the reference's learning rate",
    "wrong_scale": "the first weight reads 2x its value (a quantized weight's scale_inv x 2)",
    "drop_exp_avg": "the loaded optimizer's largest exp_avg is zeroed",
    "frozen_weights": "the optimizer never updates the weight matrices (what TE FusedAdam "
    "without master weights does to DelayedScaling FP8 weights)",
    "grads_bf16": "the reduced gradients are rounded to bf16 after each backward (a gradient "
    "reduction in a lower precision than the policy's: distributed-only)",
    "grads_bf16_before_reduce": "the gradients are cast to bf16 on their way into FSDP2's "
    "reduce-scatter (a reduce_dtype of bf16 in a collective wrapper: distributed-only)",
    "diverge_replica": "after training, the last rank's copy of a replicated parameter differs",
    "export_nan": "the safetensors export writes NaN into one exported tensor",
    "export_wrong": "the safetensors export writes 1.01x the values of one exported tensor",
    "stale_master": "after training, the optimizer's master weights are 1.01x the weights the "
    "model computes with",
    "async_differs": "one parameter changes between the sync twin and the async save",
    "restore_drift": "a further DCP mode's run (mode_group) starts one ulp off the trained "
    "state: the mode must train its own run",
    "untie_on_load": "the load leaves each tied parameter's later aliases as separate copies "
    "(what a load that assigns instead of copying does)",
    # checkpoint faults: each must end as a clear per-case error naming the checkpoint
    "kill_mid_save": "rank 1 is SIGKILLed halfway through writing its DCP shard file (sync, "
    "async_thread)",
    "kill_stager": "rank 1's async_process stager is SIGKILLed halfway through writing its shard",
    "truncate_shard": "after the save, rank 1's shard file loses its second half",
    "missing_metadata": "after the save, the checkpoint's .metadata is gone",
    "enospc": "rank 1's DCP writer fails with ENOSPC (no space left on device)",
}
# faults whose cases still share a train phase across DCP modes (launch/task_graph.py)
MODE_GROUP_FAULTS = ("none", "restore_drift")
CHECKPOINT_FAULTS = ("kill_mid_save", "kill_stager", "truncate_shard", "missing_metadata",
                     "enospc")


# Mutants of the installed TransformerEngine (te backend, harness/backends/te_mutations.py):
# each reverts one fix of the seed PRs; named like the reference backend's fixes switches.
MUTATIONS = {
    "none": "TE as installed",
    "rerun": "TE as installed, run again: the run-to-run noise the mutants are measured against",
    "rerun2": "TE as installed, a third time (two reruns: a less thin noise estimate)",
    "no_optimizer_dtensor_state": "#2795 reverted: FusedAdam states as plain local tensors",
    "no_to_copy_keeps_subclass": "#2974 reverted: _to_copy / new_empty dequantize (DCP staging)",
    "no_empty_untyped_storage": "#2974 reverted: QuantizedTensor.untyped_storage is torch's",
    "no_quantized_allgather": "FSDP2 all-gather hooks removed from TE's quantized tensors",
    "no_weights_only_pickle": "#2974 reverted: __reduce_ex__ via a bound classmethod",
    # pieces of the bundled #2713 port (backends/te_tp) off, on FSDP2 x TP cases
    "no_tp_dtensor_params": "#2713 port: TP shards stay plain parameters (no set_device_mesh)",
    "no_tp_local_identity": "#2713 port: forward gets a to_local() alias, not the local object",
    "no_tp_allgather_out": "#2713 port: fsdp_post_all_gather gets FSDP2's out= DTensor as is",
    "no_tp_block_storage": "#2713 port: block formats keep TE's 0-byte untyped_storage",
    "no_tp_amax_group": "#2713 port: current-scaling weight amax over TE's mesh['shard'] only",
}


# Workarounds of TE bugs the te backend applies (harness/backends/te_backend.py WORKAROUNDS);
# scenario te_workarounds runs without each one (axis ``without``) so its failure stays measured.
TE_WORKAROUNDS = ("hsdp_mesh_dim_names", "init_extra_state", "current_scale_group")


# Extra axes a scenario may add after the core ones: name -> (what it switches, its values;
# None: free-form values that spec._check_value validates). Anything else is a typo
# ("fualt: [hang]" would otherwise be a silent no-op axis).
EXTRA_AXES = {
    "fixes": ("reference backend: the TE fixes of harness/reference/fixes/ ('all' or one off)",
              tuple(FIX_AXIS_VALUES)),
    "optimizer": ("te backend: FusedAdam with or without fp32 master weights",
                  ("master_weights", "no_master_weights")),
    "fault": ("harness self-tests: fault injection (distributed/faults.py)", tuple(FAULTS)),
    "mutation": ("te backend: a mutant of the installed TE (backends/te_mutations.py)",
                 tuple(MUTATIONS)),
    "without": ("te backend: run without one of its TE workarounds (te_workarounds scenario)",
                ("none",) + TE_WORKAROUNDS),
    "seed": ("the case's seed for init and data (calibration); non-negative integers", None),
}


# the built-in modules that tie no parameters: tied_weights has nothing of theirs to check (a
# scenario's own model may tie: the check runs, and says so where it ties nothing)
UNTIED_MODULES = tuple(m for m in MODULES if m != "LlamaStack")


def check_applies(check: str, axes: dict[str, str]) -> bool:
    if check == "tied_weights":
        return axes.get("module") not in UNTIED_MODULES
    if check in ("quantized_allgather_parity", "weights_only_load"):
        return axes.get("recipe") in QUANTIZED_RECIPES
    if check == "async_equivalence":
        return axes.get("dcp", "sync") != "sync"
    if check == "reshard":
        return axes.get("reshard", RESHARD_NONE) != RESHARD_NONE
    return True
