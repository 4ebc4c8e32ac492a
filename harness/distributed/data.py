"""Deterministic synthetic data, per task: the global batch of a step depends only on
(seed, step), and each task (``catalog.TASKS``) says what a module is fed, what it must output
and the loss that compares the two.

    regression   float x [batch, seq, hidden]  -> [batch, seq, hidden]        MSE
    projection   float x [batch, seq, hidden]  -> [batch, seq, out_features]  MSE
    next_token   token ids [batch, seq]        -> logits [batch, seq, vocab]   cross-entropy
                 (targets: the ids shifted by one, from one sequence of seq + 1 tokens)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harness.spec import catalog
from harness.spec.base import DATA_SEED_STRIDE
from harness.spec.mesh import MeshSpec

VERSION = 1  # bump when the batches change (the FP32 reference cache keys on it)
from harness.spec.scenario import ModelDims


def step_generator(seed: int, step: int) -> torch.Generator:
    """The generator of a step's global batch (the seed bound: spec.base.SEED_MAX)."""
    return torch.Generator().manual_seed(seed * DATA_SEED_STRIDE + step)


@dataclass(frozen=True)
class Regression:
    """Float inputs, float targets of width ``dims.<out>``, MSE."""
    name: str
    out: str  # the ModelDims field of the output width

    def global_batch(self, dims: ModelDims, seed: int, step: int):
        g = step_generator(seed, step)
        x = torch.randn(dims.batch, dims.seq, dims.hidden, generator=g)
        y = torch.randn(dims.batch, dims.seq, getattr(dims, self.out), generator=g)
        return x, y

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out.float(), y.float())

    def out_shape(self, dims: ModelDims) -> tuple[int, ...]:
        return (dims.batch, dims.seq, getattr(dims, self.out))

    def describe_input(self, dims: ModelDims) -> str:
        return f"float32 [{dims.batch}, {dims.seq}, {dims.hidden}]"

    def describe_output(self) -> str:
        return f"[batch, seq, {self.out}]"


@dataclass(frozen=True)
class NextToken:
    """Token ids in [0, vocab); targets are the next tokens; mean cross-entropy over tokens."""
    name: str = "next_token"

    def global_batch(self, dims: ModelDims, seed: int, step: int):
        g = step_generator(seed, step)
        ids = torch.randint(0, dims.vocab, (dims.batch, dims.seq + 1), generator=g)
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))

    def out_shape(self, dims: ModelDims) -> tuple[int, ...]:
        return (dims.batch, dims.seq, dims.vocab)

    def describe_input(self, dims: ModelDims) -> str:
        return f"int64 token ids [{dims.batch}, {dims.seq}] in [0, {dims.vocab})"

    def describe_output(self) -> str:
        return "[batch, seq, vocab] logits"


TASKS = {"regression": Regression("regression", "hidden"),
         "projection": Regression("projection", "out_features"),
         "next_token": NextToken()}
assert set(TASKS) == set(catalog.TASKS), "catalog.TASKS lists the tasks"


def local_batch(task: str, dims: ModelDims, seed: int, step: int, mesh: MeshSpec | None, rank: int,
                device):
    """This rank's slice of the global batch; TP ranks of one data-parallel group share it.
    ``mesh=None`` gives the whole global batch (the single-process reference)."""
    x, y = TASKS[task].global_batch(dims, seed, step)
    if mesh is not None:
        n = dims.batch // mesh.dp_size
        i = mesh.dp_index(rank)
        x, y = x[i * n:(i + 1) * n], y[i * n:(i + 1) * n]
    return x.to(device), y.to(device)
