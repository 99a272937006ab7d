"""Hyperscan compile settings shared by the rule loader (which proves patterns compile) and the matcher, and the
rewrite of a pattern for raw one-line JSON values (`json_string_edges`: the matcher compiles it, the
prefilter scans with it)."""

from __future__ import annotations

import os
from pathlib import Path

import hyperscan

_BASE_FLAGS = hyperscan.HS_FLAG_MULTILINE
# The installed hyperscan's version, part of every compiled database's cache key. The package's stubs
# (__init__.pyi) leave `__version__` out, so it is read here, once.
HYPERSCAN_VERSION = str(getattr(hyperscan, "__version__", "unknown"))


def pattern_flags(caseless: bool) -> int:
    return _BASE_FLAGS | (hyperscan.HS_FLAG_CASELESS if caseless else 0)


def compile_single(pattern: str, *, caseless: bool = False) -> hyperscan.Database:
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=[pattern.encode("utf-8")], ids=[0], flags=[pattern_flags(caseless)])
    return db


def cache_dir() -> Path:
    """Where compiled databases and validation markers are kept (ROOTRANK_CACHE_DIR, else the XDG cache)."""
    base = os.environ.get("ROOTRANK_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "rootrank"
    )
    return Path(base)


_STRING_START = '(?:^|"|\\\\n)'
_STRING_END = '(?:$|(?:\\\\n)*")'
_TO_LINE_END = ("[^\\n]*", "[^\n]*", ".*")  # a `$` after these matches at the value's end anyway


def json_string_edges(pattern: bytes) -> bytes:
    """`pattern` with each `^` / `$` outside a character class also accepting a JSON string's quote."""
    text = pattern.decode("utf-8")
    for tail in ("[^\\n]*$", "[^\n]*$"):  # the routine database's "report once, at the line's end"
        if text.endswith(tail) and not text.endswith("\\" + tail):
            text = text[: -len(tail)]  # reported where the marker ends instead: inside the text
            break
    out: list[str] = []
    i, n = 0, len(text)
    in_class = False
    while i < n:
        c = text[i]
        if c == "\\":
            out.append(text[i:i + 2])
            i += 2
            continue
        if in_class:
            if c == "[" and text.startswith("[:", i):  # a POSIX class such as [:alpha:] inside [...]
                close = text.find(":]", i + 2)
                if close >= 0:
                    out.append(text[i:close + 2])
                    i = close + 2
                    continue
            if c == "]":
                in_class = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append(c)
            i += 1
            if i < n and text[i] == "^":
                out.append("^")
                i += 1
            if i < n and text[i] == "]":  # a `]` first in a class is a literal
                out.append("]")
                i += 1
            continue
        if c == "^":
            out.append(_STRING_START)
        elif c == "$" and not "".join(out[-6:]).endswith(_TO_LINE_END):
            out.append(_STRING_END)
        else:
            out.append(c)
        i += 1
    return "".join(out).encode("utf-8")
