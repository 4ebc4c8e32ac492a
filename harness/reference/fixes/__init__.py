"""The TransformerEngine fixes the harness is built around, as small toggleable reference code
(and one that TE does not have yet: ``partial_slice_view``).

Each module here holds one fix: the fixed behaviour and, next to it, the behaviour before the
fix (what TE did before the pull request). A case's ``fixes`` axis turns them on or off:
``all`` (every fix on) or ``no_<name>`` (that one off). With a fix off, the scenario that
exposes its bug must fail (``scenarios/fix_verification.yaml`` + xfail registry entries); with it
on, it passes. That proves each check can catch the bug it is meant to catch.
"""

from __future__ import annotations

from harness.spec.catalog import FIXES  # the names and what each fixes (plain data)

_off: set[str] = set()
_listeners = []  # called after configure() (e.g. to (un)register safe globals)


def configure(spec: str) -> None:
    """``all`` or ``no_<fix>``: set which fixes are on for the next case."""
    global _off
    if spec == "all":
        off = set()
    elif spec.startswith("no_") and spec[3:] in FIXES:
        off = {spec[3:]}
    else:
        raise ValueError(f"fixes={spec!r}: expected 'all' or 'no_<fix>' with fix one of "
                         f"{', '.join(FIXES)}")
    _off = off
    for fn in _listeners:
        fn()


def on(name: str) -> bool:
    if name not in FIXES:
        raise KeyError(name)
    return name not in _off

