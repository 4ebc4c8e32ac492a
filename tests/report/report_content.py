"""A markup-free extract of a rendered report, to compare two renderings by content.

For every top-level part of ``<main>`` (each ``<section id=...>`` and the "how to read" box) the
extract holds its heading and the visible text split into whitespace-separated tokens (plus the
``title``, ``alt`` and ``href`` attributes: tooltips and links are content too), in document
order. Markup, whitespace, figure bytes and inline CSS are left out, so a template rewrite that
shows the same things compares equal. Paths of the machine that rendered (temporary history
directories) are replaced by a placeholder before tokenizing.

:func:`summary` turns the extract into a small JSON-able dict for a golden file: short sections
keep their sorted tokens (a diff shows what changed), long ones keep counts and hashes, per
leading character of the token so that a difference still points somewhere.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from html.parser import HTMLParser

#: sections with at most this many tokens keep their full token list in the summary
FULL_TOKENS = 160
_ATTRS = ("title", "alt", "aria-label", "href")
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
         "track", "wbr"}


class _Extract(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: dict[str, dict] = {}  # id -> {"heading": str, "tokens": [...]}
        self.ids: list[tuple[str, str]] = []  # (part, id) of every element with an id
        self.nav: list[tuple[str, str]] = []  # (href, text) of the page's navigation
        self.stack: list[str] = []
        self.part: str | None = None
        self.part_depth = 0
        self.heading: list[str] | None = None
        self.skip = 0  # inside <style> / <svg>: not visible text
        self.in_nav = False
        self.nav_href: str | None = None

    def _text(self, s: str) -> None:
        if self.part is not None:
            self.parts[self.part]["tokens"] += s.split()
            if self.heading is not None:
                self.heading.append(s)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("style", "script", "svg"):
            self.skip += 1
        if tag not in _VOID:
            self.stack.append(tag)
        if tag == "nav":
            self.in_nav = True
        if self.in_nav and tag == "a":
            self.nav_href = a.get("href", "")
            self.nav.append((self.nav_href, ""))
        if self.part is None and (
                (tag == "section" and a.get("id")) or
                (tag == "details" and "howto" in (a.get("class") or "").split())):
            self.part = a.get("id") or "howto"
            self.part_depth = len(self.stack)
            self.parts[self.part] = {"heading": "", "tokens": []}
        if a.get("id") and not self.skip:  # ids inside a figure are the figure's business
            self.ids.append((self.part or "", a["id"]))
        if self.part is not None:
            if tag in ("h2", "summary") and not self.parts[self.part]["heading"]:
                self.heading = []
            for k in _ATTRS:
                if a.get(k) and not (k == "href" and not a[k].startswith("#")):
                    self._text(f"href={a[k]}" if k == "href" else a[k])

    def handle_endtag(self, tag):
        if tag in ("style", "script", "svg"):
            self.skip = max(0, self.skip - 1)
        if tag == "nav":
            self.in_nav = False
        if tag == "a":
            self.nav_href = None
        if self.heading is not None and tag in ("h2", "summary"):
            self.parts[self.part]["heading"] = " ".join(" ".join(self.heading).split())
            self.heading = None
        if tag in _VOID or tag not in self.stack:
            return
        while self.stack:
            t = self.stack.pop()
            if self.part is not None and len(self.stack) < self.part_depth:
                self.part = None
            if t == tag:
                break

    def handle_data(self, data):
        if self.skip:
            return
        if self.nav_href is not None and self.in_nav:
            h, t = self.nav[-1]
            self.nav[-1] = (h, (t + data).strip())
        self._text(data)


def extract(text: str, replace: dict[str, str] | None = None) -> dict:
    """{"parts": {id: {"heading", "tokens"}}, "nav": [(href, text)], "ids": [(part, id)]}."""
    for old, new in (replace or {}).items():
        text = text.replace(old, new)
    p = _Extract()
    p.feed(text)
    p.close()
    return {"parts": p.parts, "nav": p.nav, "ids": p.ids}


def _sha(tokens) -> str:
    return hashlib.sha256("\n".join(tokens).encode()).hexdigest()[:16]


def _bucket(token: str) -> str:
    c = token[:1].lower()
    return c if c.isalnum() and c.isascii() else "other"


def summary(ex: dict, exclude: tuple[str, ...] = ()) -> dict:
    """A small, diffable, JSON-able digest of :func:`extract` without the ``exclude`` parts."""
    parts = {}
    for pid, part in ex["parts"].items():
        if pid in exclude:
            continue
        toks = part["tokens"]
        d = {"heading": part["heading"], "n_tokens": len(toks),
             "sha_in_order": _sha(toks), "sha_sorted": _sha(sorted(toks))}
        if len(toks) <= FULL_TOKENS:
            d["tokens"] = sorted(toks)
        else:
            by = {}
            for t in toks:
                by.setdefault(_bucket(t), []).append(t)
            d["by_first_char"] = {k: [len(v), _sha(sorted(v))] for k, v in sorted(by.items())}
            d["most_common"] = [[t, n] for t, n in Counter(toks).most_common(12)]
        parts[pid] = d
    ids = sorted(i for p, i in ex["ids"] if p not in exclude)
    return {"sections": list(parts), "parts": parts,
            "nav": [[h, t] for h, t in ex["nav"] if h.lstrip("#") not in exclude],
            "ids": {"n": len(ids), "sha": _sha(ids),
                    "prefixes": dict(sorted(Counter(i.rstrip("0123456789") for i in ids)
                                            .items()))}}


def diff(want: dict, got: dict) -> list[str]:
    """Human-readable differences between two summaries (empty when equal)."""
    out = []
    if want["sections"] != got["sections"]:
        out.append(f"sections: {want['sections']} != {got['sections']}")
    if want["nav"] != got["nav"]:
        out.append(f"nav: {want['nav']} != {got['nav']}")
    if want["ids"] != got["ids"]:
        out.append(f"ids: {want['ids']} != {got['ids']}")
    for pid in want["parts"]:
        a, b = want["parts"][pid], got["parts"].get(pid)
        if b is None:
            out.append(f"{pid}: missing")
            continue
        for k in a:
            if a[k] != b.get(k):
                if k == "tokens":
                    ca, cb = Counter(a[k]), Counter(b.get(k, []))
                    out.append(f"{pid}.tokens: lost {dict(ca - cb)}, gained {dict(cb - ca)}")
                elif k == "by_first_char":
                    bad = {c: (a[k].get(c), b[k].get(c)) for c in set(a[k]) | set(b[k])
                           if a[k].get(c) != b[k].get(c)}
                    out.append(f"{pid}.{k} differs: {bad}")
                else:
                    out.append(f"{pid}.{k}: {a[k]!r} != {b.get(k)!r}")
    return out
