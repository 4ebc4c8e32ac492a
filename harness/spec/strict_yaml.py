"""YAML that refuses what plain ``yaml.safe_load`` silently resolves: a mapping naming the same
key twice (``safe_load`` keeps the last one, so a second ``axes:`` block replaces the first
without a word).

    data = strict_yaml.load(path)   # DuplicateKeyError: "line 12: duplicate key 'axes' ..."

Merge keys (``<<: *anchor``) still override as YAML defines; only keys written twice in one
mapping are errors. Used for scenario files (spec.py); usable for any harness YAML.
"""

from __future__ import annotations

from pathlib import Path

import yaml


class DuplicateKeyError(yaml.YAMLError):
    """A mapping names one key twice; the message gives both lines."""


class StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """``yaml.SafeLoader`` whose mappings reject duplicate keys; parsed by libyaml where PyYAML
    has it (a scenario of 60,000 ``cases`` rows: seconds, not a minute in the Python parser)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in first:
                        raise DuplicateKeyError(
                            f"line {line}: duplicate key {key!r} (first at line {first[key]}); "
                            f"a mapping may name each key once")
                    first[key] = line
                except TypeError:  # an unhashable key: SafeLoader reports it itself
                    continue
        return super().construct_mapping(node, deep=deep)


def loads(text: str):
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 -- a SafeLoader subclass


def load(path: str | Path):
    return loads(Path(path).read_text())
