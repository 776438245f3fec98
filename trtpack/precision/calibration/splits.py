"""Calibration / search / check / held-out splits of calibration samples, stratified by length.

*calibration* sets the quantization ranges; the fallback search decides on *calibration* and
*search* together (with short prefixes of their lines added); *check* is consulted after
each search round and, when it fails, the search goes on more conservatively; *held-out*
(the certifying part) is judged once, at the end, gates the build and is the figure
reported as held-out: no decision used it. Short, medium and long inputs are each spread
over every split; a file without short inputs gets a warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MAX_HELD_OUT = 48

MAX_SEARCH = 24

MAX_CHECK = 32

MIN_SAMPLES_FOR_HELD_OUT = 10

# Token-count strata of the split: short (a few words, where INT8 error shows most in a
# mean-pooled embedding), medium, long.
SHORT_TOKENS = 8

MEDIUM_TOKENS = 24

STRATA = ("short", "medium", "long")


def stratum(tokens: int) -> str:
    return "short" if tokens <= SHORT_TOKENS else (
        "medium" if tokens <= MEDIUM_TOKENS else "long")


@dataclass(frozen=True)
class Splits:
    """Row indices of each split."""

    calibration: list[int]
    search: list[int]
    held_out: list[int]
    check: list[int] = field(default_factory=list)


def split_three(lengths: Sequence[int], max_samples: int, seed: int) -> Splits:
    """Calibration / search / held-out / check rows, stratified by length: within each
    stratum (short / medium / long, see ``stratum``), after a shuffle with ``seed``, the rows
    go held-out, check, search, calibration, calibration in turn, so every stratum with at
    least four samples is in every split. The search, check and held-out splits are capped
    (``MAX_SEARCH``, ``MAX_CHECK``, ``MAX_HELD_OUT``); under ``MIN_SAMPLES_FOR_HELD_OUT``
    samples everything calibrates."""
    n = len(lengths)
    if n < MIN_SAMPLES_FOR_HELD_OUT:
        return Splits(list(range(n))[:max_samples], [], [])
    rng = np.random.default_rng(seed)
    calibration: list[int] = []
    search: list[int] = []
    held_out: list[int] = []
    check: list[int] = []
    cycle = (held_out, check, search, calibration, calibration)
    for name in STRATA:
        rows = [i for i, t in enumerate(lengths) if stratum(t) == name]
        for k, i in enumerate(rng.permutation(rows).tolist() if rows else []):
            cycle[k % len(cycle)].append(int(i))
    # caps: overflow of the held-out and search splits goes to calibration
    held_out_keep = _spread(held_out, MAX_HELD_OUT)
    search_keep = _spread(search, MAX_SEARCH)
    check_keep = _spread(check, MAX_CHECK)
    kept = {*held_out_keep, *search_keep, *check_keep}
    calibration += [i for i in held_out + search + check if i not in kept]
    return Splits(sorted(calibration)[:max_samples] if len(calibration) <= max_samples
                  else sorted(rng.permutation(calibration)[:max_samples].tolist()),
                  sorted(search_keep), sorted(held_out_keep), sorted(check_keep))


def _spread(rows: list[int], cap: int) -> list[int]:
    """At most ``cap`` of ``rows`` (already stratified and shuffled), evenly taken."""
    if len(rows) <= cap:
        return list(rows)
    step = len(rows) / cap
    return [rows[int(k * step)] for k in range(cap)]


def strata_counts(lengths: Sequence[int], splits: Splits) -> dict[str, dict[str, int]]:
    found: dict[str, dict[str, int]] = {}
    for split, rows in (("calibration", splits.calibration), ("search", splits.search),
                        ("check", splits.check), ("holdout", splits.held_out)):
        found[split] = {name: sum(stratum(lengths[i]) == name for i in rows)
                        for name in STRATA}
    return found


def strata_warnings(path: Path, lengths: Sequence[int]) -> list[str]:
    present = {stratum(t) for t in lengths}
    missing = [s for s in STRATA if s not in present]
    if not missing:
        return []
    bounds = {"short": f"<= {SHORT_TOKENS} tokens",
              "medium": f"{SHORT_TOKENS + 1}-{MEDIUM_TOKENS} tokens",
              "long": f"> {MEDIUM_TOKENS} tokens"}
    return [f"calibration file {path} has no {s} inputs ({bounds[s]}): INT8 accuracy on "
            f"such inputs is not measured by the held-out gate" for s in missing]
