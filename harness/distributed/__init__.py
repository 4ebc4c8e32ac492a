"""The torch building blocks a rank runs on (below the worker, the checks and the backends):
the harness's plain modules and deterministic data, a model sharded on a device mesh (FSDP2,
HSDP, TP), state trees and raw buffers of quantized tensors, gathers and flags across ranks,
DCP checkpoints and the async stager, the FP32 reference run, injected faults. Receives cases
(``spec``); hands tensors and state to the worker and the checks."""
