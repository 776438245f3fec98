"""Hypothesis strategies shared by the parser fuzz tests: inputs made from valid ones by
small edits (what a user's typo, a truncated download or a flipped bit produce), and the
settings every suite runs with (no deadline, no example database), in one of two profiles:
``quick`` (``make test``: ``QUICK_EXAMPLES`` inputs per property, a fixed seed) and ``full``
(``TRTPACK_FUZZ=full``, ``make test-slow``: each suite's own count, a new seed each run)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FUZZ_SETTINGS: dict[str, Any] = {
    "deadline": None, "derandomize": True, "database": None, "print_blob": False,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large,
                              HealthCheck.filter_too_much],
}


FULL_SEARCH = os.environ.get("TRTPACK_FUZZ", "quick") == "full"
QUICK_EXAMPLES = 100  # the floor per property in make test
QUICK_MARGIN = 20  # inputs Hypothesis may discard (filtered, duplicate) before the floor


def fuzz_settings(examples: int) -> Callable[[Any], Any]:
    """``settings`` for one suite: ``examples`` generated inputs on a new seed each run in the
    full search; ``QUICK_EXAMPLES`` (and the margin) on a fixed seed otherwise."""
    if FULL_SEARCH:
        return settings(max_examples=examples, **{**FUZZ_SETTINGS, "derandomize": False})
    return settings(max_examples=QUICK_EXAMPLES + QUICK_MARGIN, **FUZZ_SETTINGS)


def min_examples(full: int) -> int:
    """The inputs a suite must have seen: ``full`` in the full search, else
    ``QUICK_EXAMPLES``."""
    return full if FULL_SEARCH else QUICK_EXAMPLES


GENERATED: dict[str, int] = {}
"""Inputs generated per parser in this session (tests/fuzz/conftest.py prints the total)."""


class Counter:
    """How many inputs a suite's property saw (each suite asserts ``min_examples``)."""

    def __init__(self, parser: str) -> None:
        self.parser = parser
        self.count = 0

    def __call__(self) -> None:
        self.count += 1
        GENERATED[self.parser] = self.count


# Characters a typo, a paste or another tool's file could put in a text field.
NASTY_TEXT = "0123456789x:,=.-_ \t\n#!&*[]{}'\"|>%@`\\/abcXYZéİ٣²\x00\u202e"


@st.composite
def edited_text(draw: st.DrawFn, valid: st.SearchStrategy[str],
                alphabet: str = NASTY_TEXT, max_edits: int = 4) -> str:
    """A valid string with up to ``max_edits`` character insertions, deletions, replacements,
    duplications of a slice or truncations; sometimes none (the valid string itself)."""
    text = draw(valid)
    for _ in range(draw(st.integers(0, max_edits))):
        op = draw(st.sampled_from(["insert", "delete", "replace", "duplicate", "truncate"]))
        at = draw(st.integers(0, len(text)))
        if op == "insert":
            text = text[:at] + draw(st.text(alphabet, min_size=1, max_size=3)) + text[at:]
        elif op == "delete" and text:
            text = text[:at] + text[at + 1:]
        elif op == "replace" and text:
            text = text[:at] + draw(st.sampled_from(alphabet)) + text[at + 1:]
        elif op == "duplicate":
            end = draw(st.integers(at, len(text)))
            text = text[:end] + text[at:end] + text[end:]
        elif op == "truncate":
            text = text[:at]
    return text


@st.composite
def damaged_bytes(draw: st.DrawFn, data: bytes, focus: int | None = None) -> bytes:
    """``data`` truncated, with bits flipped, with a run of bytes overwritten, or with bytes
    cut from the middle (``focus``: flips land in the first ``focus`` bytes more often,
    where the headers and the graph are)."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["truncate", "flip", "flip", "overwrite", "cut"]))
        if not out:
            break
        limit = len(out) - 1
        if focus is not None and draw(st.booleans()):
            limit = min(limit, focus)
        at = draw(st.integers(0, limit))
        if op == "truncate":
            del out[at:]
        elif op == "flip":
            out[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "overwrite":
            chunk = draw(st.binary(min_size=1, max_size=16))
            out[at:at + len(chunk)] = chunk
        else:
            del out[at:at + draw(st.integers(1, 64))]
    return bytes(out)


# JSON/YAML values of every kind, for replacing a field of a valid document.
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
ANY_VALUE = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)


def paths_of(document: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path of a nested dict/list document (for choosing a field to mutate)."""
    found = [prefix] if prefix else []
    if isinstance(document, dict):
        for key, value in document.items():
            found += paths_of(value, (*prefix, key))
    elif isinstance(document, list):
        for i, value in enumerate(document):
            found += paths_of(value, (*prefix, i))
    return found


@st.composite
def mutated_document(draw: st.DrawFn, document: Any, values: st.SearchStrategy[Any] = ANY_VALUE,
                     max_changes: int = 3) -> Any:
    """A deep copy of ``document`` with up to ``max_changes`` fields replaced by values of any
    type, deleted, or given a sibling key it does not have."""
    import copy

    doc = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, max_changes))):
        paths = paths_of(doc)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        op = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if op == "replace":
            parent[path[-1]] = draw(values)
        elif op == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(values)
        else:
            parent.append(draw(values))
    return doc
