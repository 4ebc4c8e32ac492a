"""Which cases of the shipped scenarios have no calibrated population at their configuration
(``python -m harness calibrate`` prints them): a run calibrates those on demand
(``on_demand.py``), which costs it time; a calibration run on that hardware closes the gap. Lists, per (backend, device, process groups, recipe, check / quantity), how many
cases -- the gaps a calibration run on that hardware would close. Counted over the expanded
scenarios: a case that would skip on a given GPU (its recipe needs another capability) counts
too."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from harness.calibration.derive import SCENARIOS
from harness.calibration.on_demand import missing
from harness.spec.matrix import expand
from harness.spec.base import ScenarioError
from harness.spec.scenario import load_scenario

# where the shipped scenarios run: CPU (gloo), one GPU with shared ranks (gloo), NCCL
TARGETS = (("torch", "cpu", "gloo"), ("reference", "cpu", "gloo"), ("te", "cuda", "gloo"),
           ("te", "cuda", "nccl"))
NOT_A_MATRIX = (*SCENARIOS, "xfails")  # the calibration itself; the registry


def uncovered(scenario_dir: Path, measured: dict | None = None,
              targets=TARGETS) -> Counter:
    """(backend, device, pg_backend, recipe, check, quantity) -> cases without a population."""
    gaps: Counter = Counter()
    for path in sorted(Path(scenario_dir).glob("*.yaml")):
        if path.stem in NOT_A_MATRIX:
            continue
        spec = load_scenario(path)
        for backend, device, pg in targets:
            try:
                cases = expand(spec, backend)
            except ScenarioError:  # the scenario is not for this backend
                continue
            for case in cases:
                for check, quantity in missing(case, device, pg, measured):
                    gaps[(backend, device, pg, case.recipe, check, quantity)] += 1
    return gaps


def report(gaps: Counter) -> str:
    if not gaps:
        return "every calibrated quantity of every shipped case has a population"
    lines = [f"no calibrated population (the quantity fails unjudged) for {sum(gaps.values())} "
             f"case quantities:"]
    for (b, d, pg, r, c, q), n in sorted(gaps.items()):
        lines.append(f"  {b}/{d}/{pg} {r} {c}/{q}: {n} cases")
    return "\n".join(lines)
