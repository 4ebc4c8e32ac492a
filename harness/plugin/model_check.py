"""Load-time check of the scenarios' own model factories (pytest collection): each model is
imported, built as the reference and run once on its task's batch, so a broken factory is a
one-line usage error naming the scenario file, not a failure deep in a worker."""

from __future__ import annotations

from harness.spec.base import ScenarioError
from harness.spec.models import (
    ModelError,
    ModelRef,
    _one_line,
    build,
    context,
    load_object,
    locate,
    tp_plan,
)


def probe(ref: ModelRef, case, backend: str, device: str, needs_tp: bool) -> None:
    """Load-time check: build the model as the reference, run one forward on the task's global
    batch, check the output shape (and the TP plan where a case needs it). ModelError if not."""
    import torch

    from harness.distributed import data
    if ref.tp_plan is not None:
        load_object(ref.tp_plan, "tp_plan")
    ctx = context(case, backend, case.train.seed, torch.device(device), reference=True)
    model = build(ref, ctx)
    task = data.TASKS[ref.task]
    x, _ = task.global_batch(case.model, case.train.seed, 0)
    try:
        with torch.no_grad():
            out = model(x.to(device))
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"factory {ref.factory}: the model's forward raised {_one_line(e)} on "
                         f"the '{ref.task}' task's input {task.describe_input(case.model)}") \
            from None
    want = task.out_shape(case.model)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelError(f"factory {ref.factory}: the model returns {got}, the '{ref.task}' "
                         f"task needs {want} ({task.describe_output()})")
    if needs_tp:
        tp_plan(ref, model, ctx)



def check_scenario(spec, cases: list, backend, backend_name: str, device: str) -> None:
    """Load time: every model a factory builds for ``cases`` is imported, built as the reference
    and run once on its task's batch where this machine can run a case of it (else its module
    is only located). A problem is a ScenarioError naming the scenario file and the factory,
    not a failure deep in a worker."""
    groups: dict[tuple, list] = {}
    for c in cases:
        if c.model_ref is not None:
            groups.setdefault((c.model_ref, c.model), []).append(c)
    for (ref, _), group in groups.items():
        runnable = [c for c in group if backend.skip_reason(c, device) is None]
        try:
            if not runnable:
                locate(ref.factory)
                continue
            needs_tp = any(max(m.tp for m in (c.mesh, c.target) if m) > 1 for c in runnable)
            probe(ref, runnable[0], backend_name, device, needs_tp)
        except ModelError as e:
            raise ScenarioError(f"{spec.path}: {ref.origin}: {e}") from None
