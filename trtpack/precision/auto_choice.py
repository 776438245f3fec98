"""``--precision auto``: the candidates timed at the profile corners (``trtpack.timing``, the
way ``trtpack bench`` times), and the choice: the fastest candidate whose gates passed,
unless it is within the measured noise of a more accurate one (then the more accurate one,
so that the choice does not flip from run to run)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtpack.cases import Case
from trtpack.timing import RunOnce, Timing, measure_interleaved

ROUNDS = 5  # timed rounds per corner; their spread is the noise
SECONDS_PER_CORNER = 2.0
Measure = Callable[[Mapping[str, RunOnce], float], Mapping[str, Timing]]


@dataclass
class Candidate:
    """One precision's served form, its gates, and its timings per corner."""

    name: str  # "fp32", "int8"
    path: Path
    passed: bool  # every per-sample gate (corners and held-out data)
    worst: float | None  # worst per-sample metric on held-out data (or the corners)
    p50_ms: dict[str, float] = field(default_factory=dict)  # corner label -> median
    spread: dict[str, float] = field(default_factory=dict)  # (max-min)/median over rounds

    def to_dict(self) -> dict[str, Any]:
        found = asdict(self)
        found["path"] = self.path.name
        return found


@dataclass(frozen=True)
class AutoChoice:
    winner: str
    reason: str
    noise: float  # the relative noise the winner had to beat
    candidates: list[Candidate]

    def to_dict(self) -> dict[str, Any]:
        return {"winner": self.winner, "reason": self.reason, "noise": round(self.noise, 4),
                "candidates": [c.to_dict() for c in self.candidates]}


def time_candidates(candidates: Sequence[Candidate], cases: Sequence[Case],
                    sessions: Mapping[str, Any], *, seconds: float = SECONDS_PER_CORNER,
                    rounds: int = ROUNDS, measure: Measure = measure_interleaved) -> None:
    """Each candidate's p50 at each case (a profile corner) and the spread of that p50 over
    ``rounds`` rounds, the candidates timed in rotation within each round."""
    for case in cases:
        per_round: dict[str, list[float]] = {c.name: [] for c in candidates}
        for _ in range(rounds):
            calls: dict[str, RunOnce] = {}
            for c in candidates:
                session = sessions[c.name]
                names = {i.name for i in session.get_inputs()}
                feed = {k: v for k, v in case.inputs.items() if k in names}
                calls[c.name] = _call(session, feed)
            timings = measure(calls, seconds / rounds)
            for name, timing in timings.items():
                per_round[name].append(statistics.median(timing.latencies_s) * 1000)
        for c in candidates:
            values = per_round[c.name]
            middle = statistics.median(values)
            c.p50_ms[case.label] = round(middle, 4)
            c.spread[case.label] = round((max(values) - min(values)) / middle, 4) \
                if middle > 0 else 0.0


def _call(session: Any, feed: Mapping[str, Any]) -> RunOnce:
    return lambda: session.run(None, dict(feed))


def choose(candidates: Sequence[Candidate]) -> AutoChoice:
    """``candidates`` most accurate first. Each passing candidate that is faster than the
    current choice by more than the noise (geometric mean over the corners of the p50
    ratios, against the mean over corners of the larger spread of the two) takes its place."""
    passing = [c for c in candidates if c.passed]
    if not passing:
        raise ValueError("no candidate passed its gates")
    chosen = passing[0]
    noise = 0.0
    reasons: list[str] = []
    for other in passing[1:]:
        corners = [k for k in chosen.p50_ms if k in other.p50_ms]
        ratio = math.exp(statistics.fmean(
            math.log(chosen.p50_ms[k] / other.p50_ms[k]) for k in corners))
        pair_noise = statistics.fmean(max(chosen.spread[k], other.spread[k]) for k in corners)
        if ratio > 1 + pair_noise:
            reasons.append(f"{other.name} is {ratio:.2f}x as fast as {chosen.name} (geometric "
                           f"mean over {len(corners)} corners; noise {pair_noise:.1%})")
            chosen, noise = other, pair_noise
        else:
            reasons.append(f"{other.name} is {ratio:.2f}x as fast as {chosen.name}, within "
                           f"the noise ({pair_noise:.1%}): the more accurate {chosen.name} "
                           "stays")
            noise = max(noise, pair_noise)
    failed = [c.name for c in candidates if not c.passed]
    if failed:
        reasons.append(f"{', '.join(failed)} failed {'its' if len(failed) == 1 else 'their'} "
                       "per-sample gates")
    return AutoChoice(chosen.name, "; ".join(reasons) or f"{chosen.name} is the only "
                      "candidate", noise, list(candidates))
