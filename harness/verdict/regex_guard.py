"""Registry ``message`` regexes that cannot hang a run.

Python's ``re`` backtracks: a pattern that nests a repeat inside a repeat (``(.*.*)*Z$``,
``(a+)+``) takes exponential time on a detail that does not match, and many unbounded repeats
in a row take polynomial time of a high degree. Two guards:

- :func:`problem` at load: a pattern that is too long, nests repeats, or holds more than
  ``MAX_UNBOUNDED`` unbounded repeats is refused with the reason (the registry's error names
  the file and the line).
- :func:`search` at match time: each search runs under a ``SIGALRM`` timer (``re`` checks for
  signals while it backtracks, so the alarm's exception ends the search) and raises
  :class:`RegexTimeout` after ``MATCH_SECONDS``. Where the timer is not ours to use (not the
  main thread, or ``SIGALRM`` / the real-time timer belongs to someone else) the search runs
  plainly and the load-time check is the guard.
"""

from __future__ import annotations

import re
import signal
import threading

try:  # the parser ``re`` compiles with (public as sre_parse before Python 3.11)
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse  # type: ignore[no-redef]

MAX_LENGTH = 1000  # characters; the registry's longest message is a few hundred
MAX_UNBOUNDED = 4  # unbounded repeats (*, +, {n,}) in one pattern
MATCH_SECONDS = 2.0  # one search of one failing row's detail

_REPEATS = {sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT}
if hasattr(sre_parse, "POSSESSIVE_REPEAT"):
    _REPEATS.add(sre_parse.POSSESSIVE_REPEAT)


class RegexTimeout(Exception):
    """A search ran past ``MATCH_SECONDS``."""


def problem(pattern: str) -> str | None:
    """Why ``pattern`` may not be used as a registry message (None: it may): not a regex,
    too long, a repeat nested in a repeat, or too many unbounded repeats."""
    if len(pattern) > MAX_LENGTH:
        return f"{len(pattern)} characters, more than {MAX_LENGTH}"
    try:
        tree = sre_parse.parse(pattern)
    except re.error as e:
        return f"bad regex: {e}"
    except RecursionError:
        return "nested too deeply"
    unbounded = [0]
    nested = _walk(tree, False, unbounded)
    if nested:
        return ("it repeats a group that itself holds a repeat, which backtracks for "
                "exponential time on a detail it does not match; write it without the nesting")
    if unbounded[0] > MAX_UNBOUNDED:
        return (f"{unbounded[0]} unbounded repeats (*, +, {{n,}}), more than {MAX_UNBOUNDED}: "
                f"backtracking over them takes polynomial time of that degree")
    return None


def _walk(tree, in_repeat: bool, unbounded: list[int]) -> bool:
    """Is there a repeat inside another repeat? Counts the unbounded repeats on the way."""
    for op, av in tree:
        if op in _REPEATS:
            lo, hi, sub = av
            if hi == sre_parse.MAXREPEAT:
                unbounded[0] += 1
            if in_repeat and hi != 1:
                return True
            if _walk(sub, in_repeat or hi not in (0, 1), unbounded):
                return True
        elif any(_walk(sub, in_repeat, unbounded) for sub in _subpatterns(op, av)):
            return True
    return False


def _subpatterns(op, av) -> list:
    if op is sre_parse.SUBPATTERN:
        return [av[-1]]
    if op is sre_parse.BRANCH:
        return list(av[1])
    if op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
        return [av[1]]
    if op is sre_parse.GROUPREF_EXISTS:
        return [p for p in av[1:] if p is not None]
    if getattr(sre_parse, "ATOMIC_GROUP", None) is op:
        return [av]
    return []


def _timer_is_ours() -> bool:
    return (threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
            and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN, None)
            and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0))


def _on_alarm(signum, frame):
    raise RegexTimeout


def search(pattern: str, text: str, seconds: float = MATCH_SECONDS) -> re.Match | None:
    """``re.search(pattern, text)``, ended with RegexTimeout after ``seconds`` (see above)."""
    if not _timer_is_ours():
        return re.search(pattern, text)
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return re.search(pattern, text)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)
