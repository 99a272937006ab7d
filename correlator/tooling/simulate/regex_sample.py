"""A string a regex matches, for the markers the rule library gives only as patterns (sequence, absence end).

exrex enumerates the strings a pattern matches in a fixed order (first alternatives first, each repeat at
its minimum count with `limit=1`), so the sample is the same on every run, without a seed.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import re
from collections.abc import Iterator

import exrex

_CATEGORY_OF_ESCAPE = {escape: category for category, escape in exrex.REVERSE_CATEGORIES.items()}
# exrex 0.12 has no characters for \S and \D: it samples "" for them and the pattern never matches.
# Printable ASCII stands in; the first one is what the sample shows.
_PRINTABLE = [chr(c) for c in range(32, 127)]
exrex.CATEGORIES.setdefault(_CATEGORY_OF_ESCAPE[r"\S"], ["x", *(c for c in _PRINTABLE if c not in " x")])
exrex.CATEGORIES.setdefault(_CATEGORY_OF_ESCAPE[r"\D"], ["a", *(c for c in _PRINTABLE if c not in "0123456789a")])

# Enough candidates for a few `\s` in one pattern (exrex tries tab, newline, ... before the space).
_CANDIDATES = 4096


def sample_matching(pattern: str, *, caseless: bool = False) -> str | None:
    """A short one-line string `pattern` matches (checked with Python re), or None when none is found."""
    flags = re.IGNORECASE if caseless else 0
    try:
        # exrex prints "[!] cannot handle expression" for atomic groups and possessive repeats; the
        # simulator's stdout is the CLI's, so that note goes nowhere (the match check below decides).
        with contextlib.redirect_stdout(io.StringIO()):
            candidates: Iterator[str] = itertools.islice(exrex.generate(pattern, limit=1), _CANDIDATES)
            for text in candidates:
                if text.isprintable() and re.search(pattern, text, flags):
                    return text
    except (re.error, RecursionError, TypeError, ValueError, KeyError):
        return None
    return None
