"""Load-time check of the scenarios' own model factories (pytest collection): each model is
imported, built as the reference and run once on its task's batch, so a broken factory is a
one-line usage error naming the scenario file, not a failure deep in a worker.

The check runs in a child process (forked for a CPU probe where this process holds no CUDA
context, else a fresh interpreter: a child forked after this process so much as counted the
GPUs cannot use CUDA -- torch's fork poisoning; a forked child computes on one thread, as
DataLoader's workers do: the OpenMP team its parent used does not fork with it, and a parallel
region would wait for it for good) that the run waits for at most ``PROBE_TIMEOUT_S``: a
factory, TP plan or forward that blocks is killed and named, and one that ends its process
(``os._exit``, ``sys.exit`` from C) is named with its exit status, instead of hanging or
silently ending the run."""

from __future__ import annotations

import multiprocessing
import signal

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



# a factory builds a small model and runs one forward: seconds, even with the imports
PROBE_TIMEOUT_S = 120.0


def _child(conn, ref, case, backend: str, device: str, needs_tp: bool) -> None:
    import torch
    torch.set_num_threads(1)  # no OpenMP team of the parent's in a forked child
    try:
        probe(ref, case, backend, device, needs_tp)
        conn.send(None)
    except ModelError as e:
        conn.send(str(e))
    except BaseException as e:  # noqa: BLE001 - anything the user's code raised
        conn.send(f"factory {ref.factory}: {_one_line(e)}")


def _context(device: str):
    """Where the probe's child starts: a fresh interpreter when it computes on CUDA or this
    process holds a CUDA context; else forked (faster)."""
    import torch
    cuda_up = torch.cuda.is_available() and torch.cuda.is_initialized()
    return multiprocessing.get_context("spawn" if cuda_up or device != "cpu" else "fork")


def probe_bounded(ref: ModelRef, case, backend: str, device: str, needs_tp: bool,
                  timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """:func:`probe` in a child process, waited for at most ``timeout_s``. ModelError when it
    reports a problem, does not return in time (killed) or ends without a word."""
    ctx = _context(device)
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, ref, case, backend, device, needs_tp),
                       daemon=True, name=f"model-check {ref.name}")
    proc.start()
    send.close()
    try:
        answered = recv.poll(timeout_s)  # a result, or the end of a child that sent none
        try:
            problem = recv.recv() if answered else _TIMED_OUT
        except EOFError:
            problem = _ENDED
        proc.join(timeout=5 if answered else 0)
        if problem is None:
            return
        if problem is _TIMED_OUT:
            raise ModelError(f"factory {ref.factory} (with its tp_plan and one forward) did not "
                             f"return within {timeout_s:g} s at collection; it was killed "
                             f"(does it wait for something, e.g. a process group or a "
                             f"download?)")
        if problem is _ENDED:
            raise ModelError(f"factory {ref.factory} ended the process at collection "
                             f"({_exit_text(proc.exitcode)}) instead of returning a model")
        raise ModelError(problem)
    finally:
        recv.close()
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)


_TIMED_OUT, _ENDED = object(), object()


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still ending after 5 s"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def check_scenario(spec, cases: list, backend, backend_name: str, device: str,
                   timeout_s: float = PROBE_TIMEOUT_S) -> None:
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
            probe_bounded(ref, runnable[0], backend_name, device, needs_tp, timeout_s)
        except ModelError as e:
            raise ScenarioError(f"{spec.path}: {ref.origin}: {e}") from None
