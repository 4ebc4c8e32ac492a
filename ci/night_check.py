"""Did a night check what it should? ``python ci/night_check.py --min-checked N JUNIT...``

A nightly job runs each scenario with ``|| status=$?`` so that every scenario runs, then this
decides: the night fails where a junit file is missing or unreadable (a crashed pytest), where
any case failed or errored, or where fewer than ``--min-checked`` cases were checked (run and
not skipped: passed or xfailed -- pytest's junit writes an xfailed case as a ``skipped`` element
of type ``pytest.xfail``, and a registered failure that failed as recorded was checked) over
all the files -- an all-skip night (no GPU, no TE, a wrong option) checks nothing and must not
pass as green. Exit 0 / 1, one line per reason.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET


def counts(path: str) -> dict[str, int]:
    """tests, failures, errors, skipped summed over a junit file's test suites, and xfailed:
    the skipped cases that were expected failures (checked, not skipped)."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    out = {k: sum(int(s.get(k, 0)) for s in suites)
           for k in ("tests", "failures", "errors", "skipped")}
    out["xfailed"] = sum(1 for s in suites for case in s.iter("testcase")
                         for sk in case.findall("skipped") if sk.get("type") == "pytest.xfail")
    return out


def check(paths: list[str], min_checked: int) -> list[str]:
    problems, checked = [], 0
    for p in paths:
        try:
            c = counts(p)
        except (OSError, ET.ParseError) as e:
            problems.append(f"{p}: no readable junit file ({e}): the run crashed or never ran")
            continue
        if c["failures"] or c["errors"]:
            problems.append(f"{p}: {c['failures']} failed, {c['errors']} errors")
        checked += c["tests"] - c["skipped"] + c["xfailed"]
    if checked < min_checked:
        problems.append(f"only {checked} case(s) checked (run, not skipped) over {len(paths)} "
                        f"file(s); this night expects at least {min_checked}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-checked", type=int, required=True)
    ap.add_argument("junit", nargs="+")
    args = ap.parse_args(argv)
    problems = check(args.junit, args.min_checked)
    for p in problems:
        print(f"night check: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
