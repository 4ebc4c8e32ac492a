"""tied_weights: parameters the module ties stay one tensor -- after training, after a load on
the same mesh and after a load on another mesh.

Which parameters are tied comes from the single-process reference build of the same module
(unsharded, by object identity: one parameter registered under several names, e.g. an LM head
and its embedding), never from the run under test: a run that lost a tie cannot pass by
having none. For each run -- ``trained``, ``loaded`` (train phase), ``resharded`` (reshard
phase) -- and every tied group:

``<run>.same_tensor``  every name resolves to the same parameter object, and that object's
                       local storage (a DTensor's local shard) is one storage
``<run>.values``       the whole tensors under every name are bitwise equal (gathered)
``<run>.optimizer``    the optimizer holds the parameter exactly once, with exactly one state,
                       and no name's tensor lies outside the optimizer (it would not train)

A module without tied parameters fails ``has_tied_weights`` (list the check for modules that
tie). Yes/no and bitwise: no tolerance.
"""

from __future__ import annotations

from harness.calibration import tolerances
from harness.checks.base import Check

CHECK_NAME = "tied_weights"


def expected_ties(art) -> list[tuple[str, ...]]:
    """Tied groups of the reference build, in canonical names."""
    from harness.distributed.parallel import tied_groups
    case = art.case
    return tied_groups(art.ctx.backend.reference_model(case, case.train.seed, art.ctx.device))


def tied_weights(art, rec, runs: dict) -> None:
    """``runs``: label -> Run, checked against the reference build's tied groups."""
    groups = expected_ties(art)
    rec.flag(CHECK_NAME, "has_tied_weights", bool(groups),
             "; ".join(" = ".join(g) for g in groups) or
             "the module ties no parameters: nothing to check")
    if groups:
        for label, run in runs.items():
            _check_run(art, rec, groups, label, run)


def _check_run(art, rec, groups, label: str, run) -> None:
    from harness.distributed.run import flatten
    canon = art.ctx.backend.canonical_names(run.model)
    by_name = {canon.get(n, n): p for n, p in run.model.named_parameters(remove_duplicate=False)}
    missing = [n for g in groups for n in g if n not in by_name]
    if missing:
        rec.flag(CHECK_NAME, f"{label}.same_tensor", False,
                 f"tied parameters missing from the model: {', '.join(missing)}")
        return
    same = [_same_tensor(g, [by_name[n] for n in g]) for g in groups]
    optim = [_one_optimizer_state(g, [by_name[n] for n in g], run.optim) for g in groups]
    rec.flag(CHECK_NAME, f"{label}.same_tensor", all(ok for ok, _ in same),
             "; ".join(why for _, why in same))
    values = flatten({n: by_name[n] for g in groups for n in g}, raw=False)
    rec.compare(CHECK_NAME, f"{label}.values", {n: values[n] for g in groups for n in g[1:]},
                {n: values[g[0]] for g in groups for n in g[1:]}, tolerances.BITWISE)
    rec.flag(CHECK_NAME, f"{label}.optimizer", all(ok for ok, _ in optim),
             "; ".join(why for _, why in optim))


def _local(p):
    return getattr(p, "_local_tensor", p)


def _same_tensor(names, params) -> tuple[bool, str]:
    objects = {id(p) for p in params}
    storages = {_local(p).untyped_storage().data_ptr() for p in params}
    tied = " = ".join(names)
    if len(objects) == 1 and len(storages) == 1:
        return True, f"{tied}: one tensor"
    apart = [n for n, p in zip(names, params) if p is not params[0]]
    return False, (f"{tied}: {len(objects)} distinct tensors, {len(storages)} storages "
                   f"({', '.join(apart)} no longer {names[0]})")


def _one_optimizer_state(names, params, optim) -> tuple[bool, str]:
    held = [p for group in optim.param_groups for p in group["params"]
            if any(p is q for q in params)]
    distinct = {id(p): (n, p) for n, p in reversed(list(zip(names, params)))}  # first name wins
    stated = [n for n, p in distinct.values() if p in optim.state]
    outside = [n for n, p in zip(names, params) if not any(p is h for h in held)]
    tied = " = ".join(names)
    if len(held) == 1 and len(stated) == 1 and not outside:
        return True, f"{tied}: held once, one state"
    return False, (f"{tied}: the optimizer holds {len(held)} of them"
                   f"{' (not ' + ', '.join(outside) + ')' if outside else ''}, "
                   f"{len(stated)} with a state ({', '.join(sorted(stated)) or 'none'})")


TRAIN = Check(CHECK_NAME, ("trained", "loaded"), lambda art, rec: tied_weights(
    art, rec, {"trained": art["trained"].run, "loaded": art["loaded"]}))
RESHARD = Check(CHECK_NAME, ("resharded",), lambda art, rec: tied_weights(
    art, rec, {"resharded": art["resharded"]}), phase="reshard")
