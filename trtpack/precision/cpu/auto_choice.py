"""``--precision auto``: the candidates timed at the profile corners (``trtpack.timing``, the
way ``trtpack bench`` times), and the choice: the fastest candidate whose gates passed,
unless it is within the measured noise of a more accurate one (then the more accurate one,
so that the choice does not flip from run to run).

The candidates take turns within each round, so load from elsewhere falls on both alike;
the comparison is paired by round: a less accurate candidate wins only if it was faster in
every round (the geometric mean over the corners of the p50 ratios), i.e. beyond the
round-to-round noise of the ratio. The candidates are warmed up once per corner (before its
first round), and a corner whose inputs are those of a corner before it (a profile ``1:1:4``)
takes that corner's figures rather than being timed again.

The budget is ``SECONDS_PER_CORNER`` per candidate and corner, or
``$TRTPACK_CPU_TIMING_SECONDS`` (the test suite sets it small: its builds time their
candidates only to check what is reported, never which is faster)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from trtpack.cases import Case
from trtpack.timing import (
    RunOnce,
    Timing,
    measure_interleaved,
    seconds_from_environment,
    spread,
)

if TYPE_CHECKING:
    from trtpack.report import JsonObject
    from trtpack.runtimes.onnxruntime import CpuSession

ROUNDS = 5  # timed rounds per corner; their spread is the noise
SECONDS_PER_CORNER = 2.0
SECONDS_ENV = "TRTPACK_CPU_TIMING_SECONDS"  # SECONDS_PER_CORNER, when set


def seconds_per_corner() -> float:
    """Each candidate's timing budget at a corner: ``$TRTPACK_CPU_TIMING_SECONDS``, else
    ``SECONDS_PER_CORNER``; a value that is not a positive number is bad input."""
    return seconds_from_environment(SECONDS_ENV, SECONDS_PER_CORNER)


class Measure(Protocol):
    """``trtpack.timing.measure_interleaved``'s signature (a test may stub the timer)."""

    def __call__(self, calls: Mapping[str, RunOnce], seconds: float, *,
                 warm: bool = True) -> Mapping[str, Timing]: ...


@dataclass
class Candidate:
    """One precision's served form, its gates, and its timings per corner."""

    name: str  # "fp32", "int8"
    path: Path
    passed: bool  # every per-sample gate (corners and held-out data)
    worst: float | None  # worst per-sample metric on held-out data (or the corners)
    p50_ms: dict[str, float] = field(default_factory=dict)  # corner label -> median
    spread: dict[str, float] = field(default_factory=dict)  # (max-min)/median over rounds
    rounds_ms: dict[str, list[float]] = field(default_factory=dict)  # each round's median

    def to_dict(self) -> JsonObject:
        found = asdict(self)
        found["path"] = self.path.name
        return found


@dataclass(frozen=True)
class AutoChoice:
    winner: str
    reason: str
    noise: float  # the relative noise the winner had to beat
    candidates: list[Candidate]

    def to_dict(self) -> JsonObject:
        return {"winner": self.winner, "reason": self.reason, "noise": round(self.noise, 4),
                "candidates": [c.to_dict() for c in self.candidates]}


def time_candidates(candidates: Sequence[Candidate], cases: Sequence[Case],
                    sessions: Mapping[str, CpuSession], *,
                    seconds: float | None = None, rounds: int = ROUNDS,
                    measure: Measure = measure_interleaved) -> None:
    """Each candidate's p50 at each case (a profile corner) and the spread of that p50 over
    ``rounds`` rounds, the candidates timed in rotation within each round, warmed up before
    the first; ``seconds`` per candidate and case (``seconds_per_corner()`` when None). A
    case whose inputs equal an earlier case's gets that case's figures."""
    budget = seconds_per_corner() if seconds is None else seconds
    timed: list[Case] = []
    for case in cases:
        same = next((t for t in timed if _same_inputs(t, case)), None)
        if same is not None:  # the same inputs: the same work, timed once
            for c in candidates:
                c.p50_ms[case.label] = c.p50_ms[same.label]
                c.rounds_ms[case.label] = list(c.rounds_ms[same.label])
                c.spread[case.label] = c.spread[same.label]
            continue
        timed.append(case)
        calls: dict[str, RunOnce] = {}
        for c in candidates:
            session = sessions[c.name]
            names = {i.name for i in session.get_inputs()}
            feed = {k: v for k, v in case.inputs.items() if k in names}
            calls[c.name] = _call(session, feed)
        per_round: dict[str, list[float]] = {c.name: [] for c in candidates}
        for round_index in range(rounds):
            timings = measure(calls, budget / rounds, warm=round_index == 0)
            for name, timing in timings.items():
                per_round[name].append(statistics.median(timing.latencies_s) * 1000)
        for c in candidates:
            values = per_round[c.name]
            middle = statistics.median(values)
            c.p50_ms[case.label] = round(middle, 4)
            c.rounds_ms[case.label] = [round(v, 4) for v in values]
            c.spread[case.label] = round(spread(values), 4)


def _same_inputs(a: Case, b: Case) -> bool:
    """Whether two cases feed the same arrays (names, shapes, dtypes and values)."""
    return a.inputs.keys() == b.inputs.keys() and all(
        a.inputs[k].shape == b.inputs[k].shape and a.inputs[k].dtype == b.inputs[k].dtype
        and np.array_equal(a.inputs[k], b.inputs[k]) for k in a.inputs)


def _call(session: CpuSession, feed: Mapping[str, np.ndarray]) -> RunOnce:
    return lambda: session.run(None, dict(feed))


def choose(candidates: Sequence[Candidate]) -> AutoChoice:
    """``candidates`` most accurate first. A passing candidate replaces the current choice
    when it was faster in every round (per round: the geometric mean over the corners of
    the current choice's p50 over its p50); the noise is the spread of those ratios."""
    passing = [c for c in candidates if c.passed]
    if not passing:
        raise ValueError("no candidate passed its gates")
    chosen = passing[0]
    noise = 0.0
    reasons: list[str] = []
    for other in passing[1:]:
        ratios = _round_ratios(chosen, other)
        ratio = statistics.median(ratios)
        pair_noise = (max(ratios) - min(ratios)) / ratio
        noise = max(noise, pair_noise)
        faster = f"{other.name} is {ratio:.2f}x as fast as {chosen.name} (median over " \
                 f"{len(ratios)} rounds of the geometric mean over the corners; " \
                 f"round-to-round spread {pair_noise:.1%})"
        if min(ratios) > 1:
            reasons.append(f"{faster}, faster in every round")
            chosen = other
        else:
            reasons.append(f"{faster}, not faster in every round: within the noise, the more "
                           f"accurate {chosen.name} stays")
    failed = [c.name for c in candidates if not c.passed]
    if failed:
        reasons.append(f"{', '.join(failed)} failed {'its' if len(failed) == 1 else 'their'} "
                       "per-sample gates")
    return AutoChoice(chosen.name, "; ".join(reasons) or f"{chosen.name} is the only "
                      "candidate", noise, list(candidates))


def _round_ratios(slow: Candidate, fast: Candidate) -> list[float]:
    corners = [k for k in slow.rounds_ms if k in fast.rounds_ms]
    rounds = min(len(slow.rounds_ms[k]) for k in corners)
    return [math.exp(statistics.fmean(
        math.log(slow.rounds_ms[k][r] / fast.rounds_ms[k][r]) for k in corners))
        for r in range(rounds)]
