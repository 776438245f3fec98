"""How trtpack times a model: warm-up, then the candidates in rotation within a time budget
(``trtpack bench`` and ``--precision auto`` time the same way). Core module: no heavy
imports."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from trtpack.errors import UserInputError

WARMUP_RUNS = 3


def seconds_from_environment(name: str, default: float) -> float:
    """A time budget in seconds from the environment variable ``name``, else ``default``; a
    value that is not a positive number is bad input."""
    given = os.environ.get(name)
    if given is None or not given.strip():
        return default
    try:
        seconds = float(given)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise UserInputError(f"{name}={given!r}: expected a positive number of seconds")
    return seconds


def spread(values: Sequence[float]) -> float:
    """How far repeated measurements of one thing disagree: (max - min) / median (0 for
    fewer than two, or a zero median)."""
    if len(values) < 2:
        return 0.0
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else 0.0


@dataclass(frozen=True)
class Timing:
    latencies_s: list[float]
    elapsed_s: float
    rounds_s: list[list[float]] = field(default_factory=list)  # the latencies of each turn

    @property
    def round_medians_s(self) -> list[float]:
        return [statistics.median(r) for r in self.rounds_s if r]

    @property
    def spread(self) -> float:
        """The spread of the turns' medians: the noise of this timing's median."""
        return spread(self.round_medians_s)


RunOnce = Callable[[], object]  # one inference; returns when its results are ready
SLICES = 5


def warm_up(run_once: RunOnce, seconds: float, warmup_runs: int = WARMUP_RUNS) -> None:
    """``warmup_runs`` calls and at least a fifth of the budget (up to a second)."""
    warm_until = time.perf_counter() + min(1.0, seconds / 5)
    runs = 0
    while runs < warmup_runs or time.perf_counter() < warm_until:
        run_once()
        runs += 1


def measure_interleaved(calls: Mapping[str, RunOnce], seconds: float,
                        slices: int = SLICES, *, warm: bool = True) -> dict[str, Timing]:
    """Time each call back to back for ``seconds`` in all, after warm-up. The budget is cut
    into ``slices`` turns taken in rotation (A B C A B C …), so that load from elsewhere on
    the machine falls on every runtime alike and their ratio stays meaningful; every call
    runs at least once per turn. Each ``Timing`` keeps its turns apart (``rounds_s``): the
    spread of their medians is the noise of the result. ``warm=False``: the same calls were
    just timed (a later round at the same inputs), so they are warm already."""
    for run_once in calls.values() if warm else ():
        warm_up(run_once, seconds)
    rounds: dict[str, list[list[float]]] = {name: [] for name in calls}
    elapsed = dict.fromkeys(calls, 0.0)
    turn = seconds / slices
    for _ in range(slices):
        for name, run_once in calls.items():
            this_turn: list[float] = []
            started = time.perf_counter()
            while True:
                t0 = time.perf_counter()
                run_once()
                this_turn.append(time.perf_counter() - t0)
                if time.perf_counter() - started >= turn:
                    break
            elapsed[name] += time.perf_counter() - started
            rounds[name].append(this_turn)
    return {name: Timing([t for r in rounds[name] for t in r], elapsed[name], rounds[name])
            for name in calls}
