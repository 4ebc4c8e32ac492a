"""One train phase for the DCP modes of a case (the ``mode_group`` acceleration layer).

Cases that differ only in their DCP mode train the same run. A group task (its ``members``:
launch/task_graph.py) runs its first case as any other and takes its run's state right before
its save (distributed/restore_point.py). Each further mode takes over what that case made and
checked before the save -- the shared producers' (``SHARED``) artifacts and the rows of the
checks that need only those -- puts the run back to that state in place, and saves, steps and
loads its own way (an async mode's sync twin is the first case's checkpoint where that is a
sync save). It is kept only where it is proven to have started from that state: the state its
save captured (*S*, every buffer) and its uninterrupted next step equal the first case's bit
for bit on every rank. Else, or where the first case made no checkpoint, the mode trains a run
of its own as without the layer, its directory emptied first, with a note saying why.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from harness.checks.compare import bits
from harness.distributed import faults, restore_point
from harness.spec import catalog
from harness.worker import producers as made_by
from harness.worker.runner import Share

SHARED = ("train", "reference", "single_rank", "export")  # the producers a mode takes over
NEEDED = ("trained", "checkpoint", "continued")  # the first case's, for a mode to share them


class Leader(Share):
    """The first case: runs as any case; its run's state is taken right before its save."""

    def __init__(self):
        self.art, self.point, self.ran, self.checked = None, None, (), ()

    def start(self, art, producers: list, checks: list):
        self.art, self.ran = art, tuple(p.name for p in producers)
        self.checked = tuple(c.name for c in checks)
        return producers, checks

    def before(self, p, art) -> None:
        if p.name == "save" and "trained" in art and "trained" not in art.missing:
            self.point = restore_point.take(art["trained"].run)

    def usable(self) -> bool:
        return self.point is not None and all(
            a in self.art and a not in self.art.missing for a in NEEDED)


class Member(Share):
    """A further mode: takes over what the first case made and checked before its save (the
    artifacts and their rows), starts from that case's run put back to the state right before
    its save, and saves, steps and loads its own way."""

    def __init__(self, leader: Leader, leader_key: str):
        self.leader, self.leader_key, self.art, self.restored = leader, leader_key, None, False

    def start(self, art, producers: list, checks: list):
        first, rec, case = self.leader, art.rec, art.case
        self.art = art
        shared = [p for p in producers if p.name in SHARED and p.name in first.ran]
        made = {m for p in shared for m in p.makes}
        for m in made:
            if m in first.art and m not in first.art.missing:
                art.have[m] = first.art[m]
            else:
                art.missing[m] = first.art.missing.get(m, "was not made")
        taken = [c for c in checks if set(c.needs) <= made and c.name in first.checked]
        units = {p.name for p in shared} | {c.name for c in taken} | {"trace"}
        made_by.case_notes(art)
        # (not the train unit's notes: the case's own are above; not the units' seconds,
        # which this mode did not spend)
        rec.rows += [dict(r) for r in first.art.rec.rows if r["check"] in units
                     and r["quantity"] != "time"
                     and not (r["check"] == "train" and r["metric"] == "note")]
        twin = " and its async_equivalence compares with that case's sync checkpoint" \
            if self._twin(case) else ""
        rec.note("train", catalog.MODE_GROUP, f"trained once with {self.leader_key} (its rows of "
                 f"{', '.join(sorted(units - {'trace'}))}): this DCP mode saved from that run's "
                 f"state right before its save, put back in place{twin}; the state it "
                 "captured and its next step equal that case's bit for bit")
        return ([p for p in producers if p not in shared], [c for c in checks if c not in taken])

    def _twin(self, case):
        """The first case's checkpoint where it is a sync save of the same state *S* and this
        mode needs one (async_equivalence), else None."""
        first = self.leader.art
        if first.case.ax["dcp"] == "sync" and "async_equivalence" in case.checks:
            return first["checkpoint"].main
        return None

    def fn(self, p):
        twin = self._twin(self.art.case) if p.name == "save" else None
        return (lambda art: made_by.save(art, sync_twin=twin)) if twin else p.fn

    def before(self, p, art) -> None:
        if not self.restored:  # inside the backend's case context (TE resets its state there)
            self.restored = True
            self.leader.point.restore()
            faults.after_restore(art.case, art["trained"].run)

    def differs(self) -> str | None:
        """Where this rank's save or next step differs from the first case's (None: equal)."""
        try:
            return self._differs()
        except Exception as e:  # a comparison that cannot be made proves nothing
            return f"not comparable: {type(e).__name__}: {e}"

    def _differs(self) -> str | None:
        art, first = self.art, self.leader.art
        if art is None or any(a not in art or a in art.missing for a in NEEDED[1:]):
            return "its save made no checkpoint"
        why = _differs(art["checkpoint"].state, first["checkpoint"].state, "saved state")
        a, b = art["continued"], first["continued"]
        if why is None and not _same_float(a.loss, b.loss):
            why = f"next-step loss {a.loss!r} against {b.loss!r}"
        return why or _differs(a.params, b.params, "next-step parameters") or \
            _differs(a.state or {}, b.state or {}, "next-step state")


class OwnRun(Share):
    """A mode that trains its own run after all: the note says why."""

    def __init__(self, why: str):
        self.why = why

    def start(self, art, producers: list, checks: list):
        art.rec.note("train", catalog.MODE_GROUP_OWN, f"trained a run of its own: {self.why}")
        return producers, checks


def results(ctx, task: dict, plan: dict, run_task, start):
    """The results of ``task`` and of its group's further modes, in order (a plain task: its
    own). ``run_task(ctx, task, plan, share)`` runs one; ``start(name)`` names it running."""
    start(task["name"])
    members = task.get("members") or ()
    if not members:
        yield run_task(ctx, task, plan)
        return
    leader = Leader()
    first = run_task(ctx, task, plan, share=leader)
    yield first
    usable = _all(ctx, leader.usable()) and not first["pg_broken"]
    for m in members:
        start(m["name"])
        why = None if usable else "the first mode's run made no checkpoint to start from"
        if why is None:
            why = _other_checks(ctx, leader, m)
        if why is None:
            member = Member(leader, first["case_key"])
            result = run_task(ctx, m, plan, share=member)
            if result["pg_broken"]:
                yield result
                return
            why = _first(ctx, member.differs())
            if why is None:
                yield result
                continue
            why = f"the mode's run put back to the trained state differed: {why}"
            _empty(ctx, Path(m["ckpt_dir"]))
            start(m["name"])  # its own run has its case's whole timeout, as on the plain path
        yield run_task(ctx, m, plan, share=OwnRun(why))


def _other_checks(ctx, leader: Leader, task: dict) -> str | None:
    """Why a mode cannot take over the first case's checks of the trained model: it has one
    that case did not run (it would run after this mode's save, on the stepped run)."""
    from harness import checks as checks_mod
    from harness.spec.matrix import Case
    before_save = {m for p in made_by.PRODUCERS if p.name in SHARED for m in p.makes}
    other = sorted(c.name for c in checks_mod.for_case(ctx.backend, Case.from_json(task["case"]))
                   if c.phase == "train" and set(c.needs) <= before_save
                   and c.name not in leader.checked)
    return f"it checks the trained model by {', '.join(other)}, the first mode not" \
        if other else None


def _all(ctx, ok: bool) -> bool:
    t = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=ctx.control)
    return bool(int(t))


def _first(ctx, why: str | None) -> str | None:
    """Every rank's finding, the same on every rank: the first rank's that differs."""
    every = [None] * ctx.world_size
    dist.all_gather_object(every, why, group=ctx.control)
    return next((f"rank {r}: {w}" for r, w in enumerate(every) if w is not None), None)


def _empty(ctx, d: Path) -> None:
    if ctx.rank == 0 and d.exists():
        shutil.rmtree(d)
        d.mkdir(parents=True)
    dist.barrier(group=ctx.control)


def _same_float(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a)
                      and math.isnan(b))


def _differs(a: dict, b: dict, what: str) -> str | None:
    if a.keys() != b.keys():
        return f"{what}: other entries ({sorted(set(a) ^ set(b))[:3]})"
    for k, x in a.items():
        y = b[k]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(_bits(x), _bits(y)):
                return f"{what}: {k} differs"
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            return f"{what}: {k} is a tensor on one side only"
        elif not _same_float(x, y) and x != y:
            return f"{what}: {k} {x!r} against {y!r}"
    return None


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``compare.bits`` of the tensor on the CPU; a placeholder (meta: the gathered value is
    rank 0's) compares by dtype and shape alone."""
    return torch.empty(0, dtype=torch.uint8) if t.is_meta else bits(t.detach().cpu())
