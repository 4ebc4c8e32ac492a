"""Where a run's cases run: the backend object, the device, the versions and GPU capability
the xfail registry and the run's meta read, the GPUs launches may use and the largest world
size that fits. Torch and the backend are imported only when asked."""

from __future__ import annotations

import os

from harness.launch import placement
from harness.plugin import gpu_count

# the ranks' variables a run's meta records (``rank_env``): what changes how CUDA, cuBLAS,
# NCCL, TE and torch run -- e.g. a user's CUDA_DEVICE_MAX_CONNECTIONS=1, which serializes each
# rank's CUDA streams and changes the run's speed: runs with and without such a setting are told
# apart
RECORDED_ENV_PREFIXES = ("CUDA_", "CUBLAS_", "NCCL_", "NVTE_", "TORCH_", "PYTORCH_")


class RunEnvironment:
    """The run's ``backend`` (name and, lazily, ``backend_obj``), ``device`` and
    ``max_world_size`` option; :meth:`describe` caches the versions."""

    def __init__(self, backend: str, device: str, max_world_size: int | None,
                 gpu_share: str = "auto"):
        self.backend = backend
        self.gpu_share = gpu_share  # --gpu-share (harness/launch/placement.py)
        # --device auto: cuda for the te backend, else cpu
        self.device = ("cuda" if backend == "te" else "cpu") if device == "auto" else device
        self.max_world_size = max_world_size
        self._backend_obj = None
        self._described: dict | None = None
        self._cuda_usable: bool | None = None
        self._gpu_count: int | None = None  # what the driver sees (visible_gpus)

    @property
    def backend_obj(self):
        if self._backend_obj is None:
            from harness import backends
            self._backend_obj = backends.get(self.backend)
        return self._backend_obj

    def describe(self) -> dict:
        """torch version, GPU capability, device and the backend's versions."""
        if self._described is None:
            import torch
            env = {"torch": torch.__version__.split("+")[0], "capability": None,
                   "device": self.device}
            if self.device == "cuda" and torch.cuda.is_available():
                major, minor = torch.cuda.get_device_capability(0)
                env["capability"] = f"{major}.{minor}"
            env.update(self.backend_obj.versions())
            self._described = env
        return self._described

    def rank_env(self) -> dict:
        """The variables of the ranks' environment named by :data:`RECORDED_ENV_PREFIXES`, as
        every launch of this run gets them (the user's and the harness's own)."""
        from harness.launch.launch import run_env
        env = run_env(self.device, {})
        return {k: env[k] for k in sorted(env) if k.startswith(RECORDED_ENV_PREFIXES)}

    def visible_gpus(self) -> list[str]:
        """GPU ids launches may use: CUDA_VISIBLE_DEVICES if the caller set it, else all the
        driver sees (NVML: torch is not imported for it; torch's count where NVML cannot
        say). Whether torch can use them is :meth:`cuda_usable`'s question."""
        if self.device != "cuda":
            return []
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        if env is not None:
            return [g.strip() for g in env.split(",") if g.strip()]
        if self._gpu_count is None:
            self._gpu_count = gpu_count.nvml_device_count()
            if self._gpu_count is None:
                import torch
                self._gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return [str(i) for i in range(self._gpu_count)]

    def max_world(self) -> int:
        """--max-world-size, else on cuda the GPU count (--gpu-share never) or, with no GPU
        at all, 0; else unlimited (ranks share GPUs where they outnumber them)."""
        if self.max_world_size:
            return self.max_world_size
        if self.device == "cuda" and (self.gpu_share == "never" or not self.visible_gpus()):
            return len(self.visible_gpus())
        return 1 << 30

    def placement(self, case) -> tuple[str, int]:
        """(process-group backend, ranks per GPU) ``case`` runs with: gloo on CPU (0 ranks
        per GPU); on cuda nccl with a GPU per rank, gloo where ranks share GPUs."""
        if self.device != "cuda":
            return "gloo", 0
        return placement.describe(case.world_sizes, self.visible_gpus(), self.gpu_share)

    def cuda_usable(self) -> bool:
        """Whether torch can run on the GPUs (a CPU-only torch on a GPU host cannot); asked
        once the cases are collected, when the backend has imported torch anyway."""
        if self._cuda_usable is None:
            import torch
            self._cuda_usable = torch.cuda.is_available()
        return self._cuda_usable

    def skip_reason(self, case, max_world: int) -> str | None:
        """Why ``case`` cannot run here (backend capability, too few ranks), or None."""
        need = max(case.world_sizes)
        reason = self.backend_obj.skip_reason(case, self.device)
        if reason is None and self.device == "cuda" and not self.cuda_usable():
            reason = "--device cuda: torch.cuda.is_available() is False here"
        if reason is None and need > max_world:
            reason = (f"needs {need} ranks; --max-world-size / available "
                      f"{'GPUs' if self.device == 'cuda' else 'ranks'}: {max_world}")
        return reason
