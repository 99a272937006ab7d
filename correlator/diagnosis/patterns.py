"""Hyperscan compile settings shared by the rule loader (which proves patterns compile) and the matcher."""

from __future__ import annotations

import os
from pathlib import Path

import hyperscan

_BASE_FLAGS = hyperscan.HS_FLAG_MULTILINE


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
