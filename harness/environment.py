"""Where a run's cases run: the backend object, the device, the versions and GPU capability
the xfail registry and the run's meta read, the GPUs launches may use and the largest world
size that fits. Torch and the backend are imported only when asked."""

from __future__ import annotations

import os


class RunEnvironment:
    """The run's ``backend`` (name and, lazily, ``backend_obj``), ``device`` and
    ``max_world_size`` option; :meth:`describe` caches the versions."""

    def __init__(self, backend: str, device: str, max_world_size: int | None):
        self.backend = backend
        # --device auto: cuda for the te backend, else cpu
        self.device = ("cuda" if backend == "te" else "cpu") if device == "auto" else device
        self.max_world_size = max_world_size
        self._backend_obj = None
        self._described: dict | None = None

    @property
    def backend_obj(self):
        if self._backend_obj is None:
            from . import backends
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

    def visible_gpus(self) -> list[str]:
        """GPU ids launches may use: CUDA_VISIBLE_DEVICES if the caller set it, else all."""
        if self.device != "cuda":
            return []
        import torch
        if not torch.cuda.is_available():
            return []
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        if env:
            return [g.strip() for g in env.split(",") if g.strip()]
        return [str(i) for i in range(torch.cuda.device_count())]

    def max_world(self) -> int:
        """--max-world-size, else the GPU count on cuda, else unlimited."""
        if self.max_world_size:
            return self.max_world_size
        if self.device == "cuda":
            import torch
            return torch.cuda.device_count() if torch.cuda.is_available() else 0
        return 1 << 30

    def skip_reason(self, case, max_world: int) -> str | None:
        """Why ``case`` cannot run here (backend capability, too few ranks), or None."""
        need = max(case.world_sizes)
        reason = self.backend_obj.skip_reason(case, self.device)
        if reason is None and need > max_world:
            reason = (f"needs {need} ranks; --max-world-size / available "
                      f"{'GPUs' if self.device == 'cuda' else 'ranks'}: {max_world}")
        return reason
