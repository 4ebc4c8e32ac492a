"""``python -m harness ab``: a speed change judged by the project's rule -- it stays only with a
gain of at least :data:`GAIN`, measured alternately on one machine (docs/performance.md).

Takes the bench JSONs (``python -m harness bench``) of the runs without the change (``--a``)
and with it (``--b``), in the order they ran; ``ci/gpu_ab.sh`` runs them A B B A ... so that a
machine that warms up (or slows down) over the call favours neither side. The two sides must
have checked the same cases to the same outcomes: a speed change that changes a verdict is not
a speed change. The gain is ``1 - mean(B) / mean(A)`` of the wall times; where it is at least
:data:`GAIN` but some B run was slower than some A run, the verdict says so (a gain within the
machine's noise).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean

GAIN = 0.10  # docs/performance.md: a speed change stays only with a measured gain of 10%


class BenchError(ValueError):
    """A file that is not a valid bench run."""


def load(paths: list[Path]) -> list[dict]:
    """The bench JSONs at ``paths``; BenchError naming one that is not a valid bench run."""
    runs = []
    for p in paths:
        try:
            run = json.loads(Path(p).read_text())
        except json.JSONDecodeError as e:
            raise BenchError(f"{p}: not JSON ({e.msg})") from e
        if not isinstance(run, dict) or not run.get("valid") or "wall_s" not in run:
            raise BenchError(f"{p}: not a valid bench run")
        runs.append(run)
    return runs


def judge(a: list[dict], b: list[dict]) -> dict:
    """The comparison of runs ``a`` (without the change) and ``b`` (with it)."""
    if not a or not b:
        raise BenchError("each side needs at least one run")
    outcomes = {json.dumps(r.get("outcomes"), sort_keys=True) for r in a + b}
    wall_a, wall_b = [r["wall_s"] for r in a], [r["wall_s"] for r in b]
    gain = 1.0 - mean(wall_b) / mean(wall_a)
    if len(outcomes) > 1:
        verdict = "the sides' outcomes differ: not a speed change"
    elif gain >= GAIN:
        verdict = f"keep: {gain:.1%} faster (>= {GAIN:.0%})" + \
            ("" if max(wall_b) < min(wall_a) else "; but some B run was slower than some A run")
    elif gain > 0:
        verdict = f"not kept: {gain:.1%} faster, below {GAIN:.0%}"
    else:
        verdict = f"not kept: {-gain:.1%} slower"
    return dict(a=[round(w, 1) for w in wall_a], b=[round(w, 1) for w in wall_b],
                mean_a=round(mean(wall_a), 1), mean_b=round(mean(wall_b), 1),
                gain=round(gain, 4), same_outcomes=len(outcomes) == 1,
                keep=len(outcomes) == 1 and gain >= GAIN, verdict=verdict)


def render(j: dict, label_a: str = "A", label_b: str = "B") -> str:
    return (f"{label_a}: {' / '.join(f'{w} s' for w in j['a'])} (mean {j['mean_a']} s)\n"
            f"{label_b}: {' / '.join(f'{w} s' for w in j['b'])} (mean {j['mean_b']} s)\n"
            f"{j['verdict']}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--a", nargs="+", type=Path, required=True, metavar="JSON",
                   help="bench JSONs of the runs without the change")
    p.add_argument("--b", nargs="+", type=Path, required=True, metavar="JSON",
                   help="bench JSONs of the runs with it")
    p.add_argument("--label-a", default="A", help="what the A runs are (default A)")
    p.add_argument("--label-b", default="B", help="what the B runs are (default B)")


def run(args: argparse.Namespace) -> int:
    """Prints the comparison; exit 0 where the change keeps its place (>= GAIN, the same
    outcomes), 1 where it does not."""
    j = judge(load(args.a), load(args.b))
    print(render(j, args.label_a, args.label_b))
    return 0 if j["keep"] else 1
