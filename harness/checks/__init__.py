"""The checks: each a ``Check`` (``base.py``) -- a name, the artifacts it needs, a function
that turns them into result rows. ``for_case`` lists the ones a case runs, in the order the
runner considers them (checks of the trained model first, while it is still the trained one).
"""

from __future__ import annotations

from harness.checks.base import Check, on_trained


def core() -> list[Check]:
    """In the order the runner considers them: tied_weights before the checks that step the
    loaded / resharded run."""
    from harness.checks import export, invariance, parity, reshard, roundtrip, tied
    return [parity.CHECK, invariance.CHECK, export.CHECK, tied.TRAIN, roundtrip.ASYNC_EQUIVALENCE,
            roundtrip.DCP_ROUNDTRIP, tied.RESHARD, reshard.CHECK]


def for_case(backend, case) -> list[Check]:
    """The case's checks: the core ones and the backend's checks of the trained model, as far
    as the scenario lists them (``case.checks``)."""
    extra = [on_trained(name, fn) for name, fn in backend.checks(case).items()]
    return [c for c in extra + core() if c.name in case.checks]
