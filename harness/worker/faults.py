"""Fault injection for the harness's negative controls (catalog.FAULTS).

A check that cannot fail proves nothing: tests run cases with these faults and assert that
the matching check fails (or that the case errors / times out) and the next case passes.
"""

from __future__ import annotations

import os
import time

import torch


def fault_of(case) -> str:
    return case.ax.get("fault", "none")


def at_case_start(case, rank: int) -> None:
    fault = fault_of(case)
    if fault == "hang" and rank == 1:
        time.sleep(10_000)
    if fault == "crash" and rank == 1:
        os._exit(3)
    if fault == "raise" and rank == 0:
        raise RuntimeError("injected fault: rank 0 raises")


def skip_load(case) -> bool:
    return fault_of(case) == "skip_load"


def reference_lr_scale(case) -> float:
    return 1.01 if fault_of(case) == "perturb_reference" else 1.0


@torch.no_grad()
def after_load(case, model, rank: int) -> None:
    if fault_of(case) != "perturb_loaded" or rank != 0:
        return
    p = next(iter(model.parameters()))
    local = p.to_local() if hasattr(p, "to_local") else p
    if local.numel():
        local.view(-1)[0] += 1e-3
