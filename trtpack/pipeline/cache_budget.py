"""The stage cache's size budget, the one policy of what to remove: entries by last use,
oldest first, counting only the bytes the cache alone holds (an entry's files are hard-linked
into the build folders that used it: removing it frees only what no folder links to), until
those fit the budget. ``TRTPACK_CACHE_BUDGET`` (``20GB``, ``500MB``; ``0``: no budget) sets
it; a build keeps its cache within it and says what it removed."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from trtpack.errors import UserInputError
from trtpack.pipeline.cache import EntryInfo, StageCache
from trtpack.resources import size_bytes

BUDGET_VARIABLE = "TRTPACK_CACHE_BUDGET"
DEFAULT_BUDGET = "10GB"


def parse_size(text: str) -> int:
    """Bytes of ``20GB``, ``500MB``, ``1.5gb``, ``0`` (binary units: ``resources.size_bytes``)."""
    found = size_bytes(text)
    if found is None:
        raise UserInputError(f"{BUDGET_VARIABLE}={text!r} is not a size; write it like 20GB "
                             "or 500MB (0: no budget)")
    return found


def cache_budget() -> int | None:
    """The budget in bytes (None: no budget)."""
    budget = parse_size(os.environ.get(BUDGET_VARIABLE, DEFAULT_BUDGET))
    return budget or None


def least_recently_used(entries: Sequence[EntryInfo], budget: int) -> list[EntryInfo]:
    """The entries to remove, least recently used first, so that the bytes the cache alone
    holds fit ``budget``; an entry whose files are all linked into build folders frees
    nothing and stays."""
    held = sum(e.own_bytes for e in entries)
    chosen = []
    for entry in sorted(entries, key=lambda e: e.modified):
        if held <= budget:
            break
        if entry.own_bytes > 0:
            chosen.append(entry)
            held -= entry.own_bytes
    return chosen


def keep_within_budget(root: Path, budget: int | None) -> str | None:
    """Remove what ``least_recently_used`` chooses from the cache at ``root``; one sentence
    saying what was removed, or None when it fits (or has no budget)."""
    if budget is None or not root.is_dir():
        return None
    cache = StageCache(root)
    entries = cache.entries()
    held = sum(e.own_bytes for e in entries)
    removed = least_recently_used(entries, budget)
    if not removed:
        return None
    for entry in removed:
        cache.discard(entry.path)
    freed = sum(e.own_bytes for e in removed)
    return (f"the stage cache {root} held {_mb(held)} of its own, over its budget of "
            f"{_mb(budget)} ({BUDGET_VARIABLE}): removed its {len(removed)} least recently "
            f"used entries ({_mb(freed)})")


def _mb(n: int) -> str:
    return f"{n / 2**30:,.1f} GB" if n >= 2**30 else f"{n / 2**20:,.1f} MB"
