"""Walk one phase of a case on every rank: producers in order, each check as soon as the
artifacts it needs exist.

* A producer or check that raises is recorded (an ``error`` row with its traceback) and does not
  stop the units that do not depend on it; a check whose artifact is missing is recorded as
  ``not_run`` with the reason ("needs the dcp load, which failed: ...").
* Ranks agree on every unit's success over the gloo control group, so all ranks take the same
  path; after a failure a bounded health check of the main group decides whether the rest of
  the case can run (else ``GroupBroken``: the remaining units are not run and the worker exits
  for a re-launch).
* Where the case's xfail entry names a workaround for a failed producer (``case.workarounds``),
  the producer is run again the workaround's way and the checks run on what it made.
* Every unit gets one coverage row: passed / failed / not_run, with the reason.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from harness import checks as checks_mod
from harness.checks.base import Artifacts
from harness.distributed import checkpoint, faults, single
from harness.distributed.checkpoint import describe
from harness.distributed.gather import on_rank0
from harness.worker.producers import PRODUCERS, TRAIN_MISSING, NotRunnable
from harness.worker.workarounds import WORKAROUNDS

ARTIFACT_LABELS = {
    "trained": "the trained model", "reference": "the FP32 reference run",
    "single_rank": "the one-rank twin",
    "checkpoint": "the DCP checkpoint", "continued": "the uninterrupted next step",
    "loaded": "the dcp load", "expected": "the train phase's checkpoint",
    "resharded": "the load on the target mesh",
}


class GroupBroken(Exception):
    """The main process group cannot be trusted after a failed unit."""


def producers_for(phase: str, checks, for_reshard: bool = False) -> list:
    """The producers whose artifacts the phase's checks need (transitively). The train phase
    always trains (the loss trace), and saves when a reshard phase will load its checkpoint
    (``for_reshard``: its own case's, or that of a case sharing the train phase)."""
    need = set().union(*(c.needs for c in checks)) if checks else set()
    if phase == "train":
        need.add("trained")
        if for_reshard:
            need.add("checkpoint")
    mine = [p for p in PRODUCERS if p.phase == phase]
    grew = True
    while grew:
        before = len(need)
        for p in mine:
            if set(p.makes) & need:
                need |= set(p.needs)
        grew = len(need) > before
    return [p for p in mine if set(p.makes) & need]


def planned_units(case) -> set[str]:
    """The units (checks, producers, ``case``) ``case`` runs: what an xfail entry may name
    failing there. A backend's own checks (``for_case``) need only the trained model."""
    core = [c for c in checks_mod.core() if c.name in case.checks]
    units = set(case.checks) | {"case"}
    for phase in ("train", "reshard") if case.target else ("train",):
        mine = [c for c in core if c.phase == phase]
        units |= {p.name for p in producers_for(phase, mine, case.target is not None)}
    return units


class Share:
    """How a phase shares its run with another case's (worker/mode_group.py: a train phase
    shared by DCP modes): what of the phase runs (``start``), a producer's function in its
    place (``fn``), each producer's turn (``before``). This one shares nothing."""

    def start(self, art, producers: list, checks: list) -> tuple[list, list]:
        return producers, checks

    def fn(self, p):
        return p.fn

    def before(self, p, art) -> None:
        pass


def run_phase(ctx, case, phase: str, ckpt, rec, health_timeout_s: float = 15.0,
              for_reshard: bool = False, share: Share | None = None) -> Artifacts:
    checks = [c for c in checks_mod.for_case(ctx.backend, case) if c.phase == phase]
    art = Artifacts(ctx, case, ckpt, rec=rec, load_fn=checkpoint.load, for_reshard=for_reshard)
    share = share or Share()
    walk = _Walk(ctx, case, art, rec, health_timeout_s, share)
    producers, pending = share.start(art, producers_for(phase, checks, for_reshard),
                                     list(checks))
    if any(p.name == "single_rank" for p in producers):  # every rank, before any unit
        single.prepare(case)
    try:
        with ctx.backend.case_context(case):
            for p in producers:
                share.before(p, art)
                walk.produce(p)
                pending = walk.run_ready(pending)
    except GroupBroken as e:
        done = {r["check"] for r in rec.rows if r["metric"] == "coverage"}
        for u in [p.name for p in producers] + [c.name for c in pending]:
            if u not in done:
                rec.status(u, "not_run", f"not run: {e}")
        raise
    for c in pending:
        m = next(a for a in c.needs if a not in art)
        rec.status(c.name, "not_run", f"not run: needs {ARTIFACT_LABELS.get(m, m)}, which "
                                      f"{art.missing.get(m, 'was not made')}")
    if phase == "train" and for_reshard and art.missing:
        # tell the reshard phase why there is no checkpoint to load
        on_rank0(ctx, lambda: (ckpt / TRAIN_MISSING).write_text(json.dumps(art.missing)))
    return art


class _Walk:
    def __init__(self, ctx, case, art, rec, health_timeout_s, share: Share):
        self.ctx, self.case, self.art, self.rec, self.share = ctx, case, art, rec, share
        self.health_timeout_s = health_timeout_s
        self.workarounds = dict(getattr(case, "workarounds", ()) or ())

    def produce(self, p) -> None:
        art, rec = self.art, self.rec
        absent = [a for a in p.needs if a not in art]
        if absent:
            why = f"needs {ARTIFACT_LABELS.get(absent[0], absent[0])}, which " \
                  f"{art.missing.get(absent[0], 'was not made')}"
            self._missing(p, f"was not made ({p.name} did not run)")
            rec.status(p.name, "not_run", f"not run: {why}")
            return
        not_runnable = []
        err = self.attempt(p.name, lambda: self._make(p, not_runnable))
        if not_runnable:
            self._missing(p, f"was not made: {not_runnable[0]}")
            rec.status(p.name, "not_run", f"not run: {not_runnable[0]}")
            return
        if err is None:
            rec.status(p.name, "passed")
            return
        w = WORKAROUNDS.get(self.workarounds.get(p.name, ""))
        if w is not None and p.loads:
            rec.note(p.name, "workaround", f"{p.name} failed ({err}); continuing with workaround "
                                           f"{w.name}: {w.what}")
            art.load_fn = w.fn
            err2 = self.attempt(p.name, lambda: art.have.update(p.fn(art)), quantity="workaround")
            art.load_fn = checkpoint.load
            if err2 is None:
                for m in p.makes:
                    art.via[m] = w.name
                rec.status(p.name, "failed", f"failed: {err}; the checks ran on what workaround "
                                             f"{w.name} made")
                return
            err = f"{err}; workaround {w.name} failed too: {err2}"
        self._missing(p, f"failed: {err}")
        rec.status(p.name, "failed", f"failed: {err}")

    def _make(self, p, not_runnable: list) -> None:
        try:
            self.art.have.update(self.share.fn(p)(self.art))
        except NotRunnable as e:  # every rank sees the same files: no disagreement
            not_runnable.append(str(e))

    def _missing(self, p, why: str) -> None:
        for m in p.makes:
            self.art.missing[m] = why

    def run_ready(self, pending: list) -> list:
        left = []
        for c in pending:
            if not all(a in self.art for a in c.needs):
                left.append(c)
                continue
            err = self.attempt(c.name, lambda c=c: c.fn(self.art, self.rec))
            via = sorted({self.art.via[a] for a in c.needs if a in self.art.via})
            note = f" (on what workaround {', '.join(via)} made)" if via else ""
            if err is not None:
                self.rec.status(c.name, "failed", f"raised: {err}{note}")
            else:  # failing comparison rows turn it into "failed" when ranks merge
                self.rec.status(c.name, "passed", f"ran{note}")
        return left

    def attempt(self, unit: str, fn, quantity: str = "error") -> str | None:
        """Run one unit on this rank; agree with the other ranks whether it succeeded
        everywhere. Returns None or a one-line reason (this rank's error, or the rank that
        failed)."""
        err, t0 = None, time.perf_counter()
        self.ctx.unit_starts(unit)
        try:
            with self.rec.section(unit, quantity):
                faults.before_unit(self.case, unit, self.ctx.rank)
                fn()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # recorded by the section; DCP raises BaseExceptions
            err = describe(e)
        self.rec.measure(unit, "time", "seconds", time.perf_counter() - t0)
        failed = _failures(self.ctx, err)
        if not failed:
            return None
        if not healthy(self.ctx, self.health_timeout_s):
            rank, why = root_cause(failed)
            self.rec.status(unit, "failed", f"failed (rank {rank}: {why})")
            raise GroupBroken(f"the process group is out of step after {unit} failed "
                              f"(rank {rank}: {why})")
        return _reason(failed, self.ctx.world_size)


def _failures(ctx, err: str | None) -> list[tuple[int, str]]:
    """(rank, error) of every rank whose unit failed, the same on every rank: one small
    all_reduce says whether any did (most units: none), then the errors travel as objects."""
    n = torch.tensor([0 if err is None else 1], dtype=torch.int32)
    dist.all_reduce(n, group=ctx.control)
    if not int(n):
        return []
    flags = [None] * ctx.world_size
    dist.all_gather_object(flags, err, group=ctx.control)
    return [(r, f) for r, f in enumerate(flags) if f is not None]


WAITED = ("timed out", "timeout", "connection closed by peer", "connection reset by peer")


def root_cause(failed: list[tuple[int, str]]) -> tuple[int, str]:
    """The (rank, error) that says why the ranks fell out of step: the first rank whose error is
    its own, not a wait for the others (a collective's timeout, a peer gone) -- an FSDP2
    assertion on rank 3 left ranks 0-2 in its all-gather until gloo's timeout, and rank 0's
    timeout had been the case's reason -- else the first rank's."""
    own = [(r, f) for r, f in failed if not any(w in f.lower() for w in WAITED)]
    return (own or failed)[0]


def _reason(failed: list[tuple[int, str]], world_size: int) -> str:
    """The same one-line reason on every rank: the error if all failed ranks agree, else each
    rank's own ("rank 0: ... | rank 1: ...")."""
    if len({f for _, f in failed}) == 1 and (len(failed) > 1 or world_size == 1):
        return failed[0][1]
    return " | ".join(f"rank {r}: {f[:800]}" for r, f in failed)


def healthy(ctx, timeout_s: float) -> bool:
    """Whether the main group and the exchange group are still in step after a failed unit.

    Called right after an agreement on the control group, which is therefore in step. First
    the ranks compare how many collectives each has issued on the two groups: a rank that
    raised where the others went on into a collective (or timed out in one they never reached)
    has a different count, and the groups are out of step at once, without waiting. Then one
    all_reduce on each group must complete within ``timeout_s`` and agree."""
    counts = [_issued(dist.group.WORLD), _issued(ctx.exchange)]
    every = [None] * ctx.world_size
    try:
        dist.all_gather_object(every, counts, group=ctx.control)
    except Exception:
        return False
    if any(c != every[0] for c in every):
        return False
    return (_reaches(dist.group.WORLD, ctx.device, ctx.world_size, timeout_s)
            and _reaches(ctx.exchange, torch.device("cpu"), ctx.world_size, timeout_s))


def _issued(group) -> int | None:
    """Collectives issued on ``group`` by this rank (None where the backend does not count)."""
    try:
        return int(group._get_sequence_number_for_group())
    except Exception:
        return None


def _reaches(group, device, world_size: int, timeout_s: float) -> bool:
    try:
        t = torch.ones(1, device=device)
        work = dist.all_reduce(t, group=group, async_op=True)
        ok = work.wait(timeout=timedelta(seconds=timeout_s))
        return bool(ok is not False) and int(t.item()) == world_size
    except Exception:
        return False
