"""Every numeric tolerance the harness applies, each with the reason for its size and where it
came from.

A comparison passes when ``max_abs <= tol.max_abs`` and ``rel_l2 <= tol.rel_l2`` and no value is
NaN / inf. ``BITWISE`` means the bit patterns must be identical (so -0.0 != 0.0).

* Round trips (a checkpoint saved and loaded, an identical computation) are bitwise.
* Everything else is **calibrated from measurement** for the case's own **configuration**
  (``Case.numerics``: model dims, steps, learning rate): the error of each (check, quantity,
  recipe, loss, metric) over clean, seeded cases of one **population** -- backend, device,
  process groups' backend (nccl, or gloo on CPU / shared GPUs), configuration, world size (a
  reshard's: source -> target) and module. The tolerance is ``FACTOR`` times the p99 (its
  largest sample where it holds ``derive.TAIL_N`` or more: :func:`statistic`) of the
  finest population with at least ``derive.MIN_N`` samples: (module, world size), the module
  over all world sizes, the world size over all modules, or all of them -- always at the case's
  configuration, never another's, and never another backend's, device's or process-group
  kind's numbers. The package's populations (``measured.csv``, ``python -m harness calibrate``)
  cover the shipped scenarios; a run calibrates any other configuration on demand
  (``on_demand.py``). ``loss`` is the module's training loss (``catalog.TASK_LOSS``). Failing
  rows and known bugs are left out of the measurement, so no failure widens a tolerance.
* Where no population exists and none is measured, the quantity is **unjudged**
  (``Tolerance.none_for``): recorded with the reason, counted, and the run is not green.
* Every tolerance carries its provenance (``source``: how, population key, n), recorded with
  each row and printed with each failure.
* A ``max_abs`` limit that could never trip is dropped (``inf``, rel-L2 judges): parameters
  under Adam move by at most ``lr (1 - b1) / sqrt(1 - b2)`` per step (Kingma & Ba 2015, sec.
  2.1), so two runs cannot end further apart than twice that per step.
* A sized bug for each calibrated tolerance proves it is tight enough to fail
  (tests/test_sized_bugs.py, tests/test_unseen_config.py).

Never raise a tolerance to make a case pass: register an xfail with a reason instead
(``scenarios/xfails.yaml``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from harness import calibration
from harness.calibration import twin
from harness.calibration.derive import ANY, MIN_N, POPULATION, TAIL_N, UNJUDGED, levels, world

# measured p99 (the largest of TAIL_N or more samples) -> tolerance. 2 (was 3 over pooled
# populations): with each population's own statistic, 2x clears the spread of the passing
# cases and leaves weights that never move (rel-L2 0.405-0.448) failing params on every recipe
FACTOR = 2.0
FLOOR = 1e-6  # below this a measured error is fp32 rounding of O(1) values, not a bound
BETA1, BETA2 = 0.9, 0.999  # Adam's betas (torch, MasterAdam and TE FusedAdam defaults)


NO_TOLERANCE = "no tolerance"  # a row detail's bound where none is known (NaN: unjudged)


def tol_text(bound: float) -> str:
    """A row detail's bound: ``tol X``, or :data:`NO_TOLERANCE` where there is none -- never
    ``tol nan``."""
    return NO_TOLERANCE if math.isnan(bound) else f"tol {bound:g}"


@dataclass(frozen=True)
class Tolerance:
    max_abs: float
    rel_l2: float
    reason: str
    nonfinite: str = ""  # why NaN / inf values may pass (empty: they fail)
    # where it comes from, in short (a row's ``tolerance_source``): "bitwise", "scenario",
    # "calibrated <population> n=<n>", "on demand <population> n=<n>"; "unjudged" -- none could
    # be derived for the case's configuration (``reason`` says why)
    source: str = ""

    @property
    def bitwise(self) -> bool:
        return self.max_abs == 0 and self.rel_l2 == 0

    @property
    def unjudged(self) -> bool:
        return self.source == UNJUDGED

    @classmethod
    def none_for(cls, why: str) -> "Tolerance":
        """No tolerance for this configuration: the quantity is measured, not judged."""
        return cls(math.nan, math.nan, why, source=UNJUDGED)

    def to_dict(self) -> dict:
        return asdict(self)


BITWISE = Tolerance(0.0, 0.0, "same bytes in, same bytes out: a checkpoint round trip or an "
                              "identical computation must be bit-exact", source="bitwise")

# Quantities that must be bit-exact whatever the recipe.
_BITWISE_QUANTITIES = {
    ("dcp_roundtrip", "state"), ("dcp_roundtrip", "next_loss"), ("dcp_roundtrip", "next_params"),
    ("dcp_roundtrip", "cached_buffers"), ("dcp_roundtrip", "rebuilt_buffers"),
    ("async_equivalence", "bytes"), ("async_equivalence", "isolation"),
    ("reshard", "state"),
}
# Parameter quantities and how many Adam steps separate the two runs compared. Not
# stored_params: a quantized weight differs from the reference by the Adam drift plus its
# format's rounding, so Adam's bound alone is no limit it stays within.
_ADAM_STEPS = {("fp32_parity", "params"): "steps", ("reshard", "next_params"): 1}


class MissingTolerance(KeyError):
    def __str__(self) -> str:  # the message itself, not KeyError's repr of it (quoted)
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Population:
    """Where a case runs, as calibration populations are keyed (``derive.POPULATION``)."""
    backend: str
    device: str
    pg_backend: str  # "nccl" (a GPU per rank) or "gloo" (CPU, or ranks sharing GPUs)
    world_size: int
    module: str
    target_world: int | None = None  # the world size a reshard loads onto (None: no reshard)
    config: str = ""  # Case.numerics: the dims, steps and lr the errors were measured at

    @classmethod
    def of_case(cls, case, device: str, pg_backend: str) -> "Population":
        """The population ``case`` runs in on ``device`` over ``pg_backend`` (the parity checks
        ask it for the live run, the coverage report for each target it plans for)."""
        t = case.target
        return cls(case.backend, device, pg_backend, case.mesh.world_size,
                   case.ax.get("module", ""), t.world_size if t else None, case.numerics)

    def key(self, kept: tuple[str, ...], check: str = "") -> tuple[str, ...]:
        """The measured.csv population columns of ``check`` at a level (``kept``)."""
        fixed = ("backend", "device", "pg_backend") + kept
        own = {**asdict(self), "world_size": world(check, self.world_size, self.target_world)}
        return tuple(str(own[c]) if c in fixed else ANY for c in POPULATION)


def describe(pop: tuple[str, ...]) -> str:
    """'te/cuda/gloo, world 4, all modules' for a population key."""
    d = dict(zip(POPULATION, pop))
    return (f"{d['backend']}/{d['device']}/{d['pg_backend']} at {d['config']}, "
            f"{'all world sizes' if d['world_size'] == ANY else 'world ' + d['world_size']}, "
            f"{'all modules' if d['module'] == ANY else d['module']}")


def _both_metrics(m: dict, key: tuple) -> tuple[dict, int]:
    """The max_abs and rel_l2 measurements of ``key`` (check .. population) and the samples
    both have (0 where either is missing)."""
    rows = {metric: m.get(key + (metric,)) for metric in ("max_abs", "rel_l2")}
    return rows, (min(r["n"] for r in rows.values()) if all(rows.values()) else 0)


def _measurement(m: dict, head: tuple, where: Population) -> tuple[tuple, dict]:
    """The finest population of ``where`` with at least MIN_N samples of both metrics."""
    tried = []
    for kept in levels(head[0]):
        pop = where.key(kept, head[0])
        rows, n = _both_metrics(m, head + pop)
        if n >= MIN_N and not finite(rows):
            tried.append(f"{describe(pop)}: n={n}, a sample not finite (a seed diverged)")
        elif n >= MIN_N:
            return pop, rows
        else:
            tried.append(f"{describe(pop)}: n={n}")
    scenario = twin.SCENARIO if head[0] == twin.CHECK else "calibration"
    raise MissingTolerance(
        f"no calibrated tolerance for check={head[0]} quantity={head[1]} recipe={head[2]} "
        f"loss={head[3]} with >= {MIN_N} passing samples ({'; '.join(tried)}): add the case "
        f"to scenarios/{scenario}.yaml and run `python -m harness calibrate` on this "
        f"hardware (or give the scenario a `tolerances` entry with its reason)")


def finite(rows: dict) -> bool:
    """Whether every statistic of a population's measurements is finite: a clean seed that
    diverged (inf / nan) leaves no tolerance to derive -- FACTOR x inf passes anything, a p99
    through inf is nan -- so such a population judges nothing (unjudged, the reason named)."""
    return all(math.isfinite(r[s]) for r in rows.values() for s in ("p99", "max"))


def adam_bound(lr: float, steps: int) -> float:
    """Two Adam runs from one start end at most this far apart per element (max_abs)."""
    return 2 * lr * (1 - BETA1) / math.sqrt(1 - BETA2) * steps


def lookup(check: str, quantity: str, recipe: str, overrides: dict | None = None,
           train=None, measured: dict | None = None, loss: str = "mse",
           where: Population | None = None, how: str = "calibrated") -> Tolerance:
    """The tolerance for ``quantity`` of ``check`` under ``recipe`` for a module trained with
    ``loss`` (``catalog.TASK_LOSS``) running ``where`` (its calibration population; ``train``:
    the case's TrainSpec, for the Adam bound; ``measured``: calibration rows, default the
    package's).

    ``overrides`` is a scenario's ``tolerances`` mapping (check -> recipe -> fields); it applies
    to every quantity of that check. Bitwise quantities cannot be overridden.
    """
    if (check, quantity) in _BITWISE_QUANTITIES:
        return BITWISE
    o = (overrides or {}).get(check, {}).get(recipe)
    if o:
        return Tolerance(float(o["max_abs"]), float(o["rel_l2"]), str(o["reason"]),
                         source="scenario")
    if where is None:
        raise MissingTolerance(f"check={check} quantity={quantity}: calibrated tolerances are "
                               f"per population (backend, device, process groups, world size)")
    m = _MEASURED if measured is None else measured
    pop, rows = _measurement(m, (check, quantity, recipe, loss), where)
    return _tolerance(check, quantity, loss, pop, rows, train, how)


def source_of(pop: tuple[str, ...], n: int, how: str = "calibrated") -> str:
    """A tolerance's provenance in one token-ish line: how, the population key, its samples."""
    return f"{how} {'/'.join(pop)} n={n}"


def statistic(rows: dict) -> str:
    """What a population's tolerance is FACTOR times: its p99, or its largest sample where it
    holds TAIL_N samples or more (seeds, or modules x seeds where pooled) or is an on-demand
    pool after its second round (``bound: max``) -- the p99 of 100 is their second largest, and
    a tail of one or two seeds in 100 lies beyond it. ``rows``: metric -> measurement (one
    metric is enough)."""
    bound = next((r["bound"] for r in rows.values() if r.get("bound")), None)
    return bound or ("max" if min(r["n"] for r in rows.values()) >= TAIL_N else "p99")


def samples_of(source: str) -> int | None:
    """The samples a tolerance's ``source`` (:func:`source_of`) names; None: it names none."""
    head, _, n = str(source).rpartition(" n=")
    return int(n) if head and n.isdigit() else None


def _tolerance(check, quantity, loss, pop, rows, train, how="calibrated") -> Tolerance:
    stat = statistic(rows)
    abs_tol = max(FACTOR * rows["max_abs"][stat], FLOOR)
    rel_tol = max(FACTOR * rows["rel_l2"][stat], FLOOR)
    steps = _ADAM_STEPS.get((check, quantity))
    why_abs = ""
    if steps is not None:
        lr = getattr(train, "lr", 1e-2)
        n = getattr(train, "steps", 3) if steps == "steps" else steps
        bound = adam_bound(lr, n)
        if abs_tol >= bound:
            abs_tol = math.inf
            why_abs = (f"; max_abs not judged: {FACTOR:g}x its {stat} reaches Adam's bound "
                       f"2 n lr (1-b1)/sqrt(1-b2) = {bound:.3g} for {n} step(s), a limit that "
                       f"could never trip")
    r = rows["rel_l2"]
    seen = f"; max seen {rows['max_abs']['max']:.3g} / {r['max']:.3g}" if stat == "p99" else ""
    what = "the p99 of the measured error" if stat == "p99" else \
        "the largest measured error (a second round of seeds after a failure)" \
        if r.get("bound") else f"the largest measured error (>= {TAIL_N} samples: a heavy tail's)"
    reason = (f"{how}: {FACTOR:g}x {what} (max_abs {rows['max_abs'][stat]:.3g}, rel-L2 "
              f"{r[stat]:.3g}{seen}) over {r['n']} passing cases of {loss} modules on "
              f"{describe(pop)}{why_abs}")
    return Tolerance(abs_tol, rel_tol, reason, source=source_of(pop, r["n"], how))


def table(train=None, measured: dict | None = None) -> list[dict]:
    """Every calibrated tolerance with its measurement and population (README / report; the
    populations with at least MIN_N samples), plus the bitwise quantities."""
    m = _MEASURED if measured is None else measured
    rows = []
    for key in sorted({k[:-1] for k in m}):
        head, pop = key[:4], key[4:]
        got, n = _both_metrics(m, key)
        if n < MIN_N or not finite(got):
            continue
        t, stat = _tolerance(head[0], head[1], head[3], pop, got, train), statistic(got)
        rows.append(dict(zip(("check", "quantity", "recipe", "loss"), head),
                         **dict(zip(POPULATION, pop)), factor=FACTOR, statistic=stat,
                         measured_max_abs=got["max_abs"][stat],
                         measured_rel_l2=got["rel_l2"][stat],
                         n=got["rel_l2"]["n"], **t.to_dict()))
    rows += [dict(check=c, quantity=q, recipe="*", loss="*", **BITWISE.to_dict())
             for c, q in sorted(_BITWISE_QUANTITIES)]
    return rows


_MEASURED = calibration.load()
