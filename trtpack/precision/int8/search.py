"""The INT8 fallback search: which node groups may stay quantized, measured on the model and
its data (on MiniLM, keeping whole op types such as Softmax, LayerNorm or Add in FP32 did
not help, and which MatMuls hurt most differed by layer). Candidates are surrogates
(``trtpack.precision.int8.surrogates``): one ONNX Runtime run each, not a ModelOpt conversion.

  1. sensitivity: quantize one group alone, measure the damage (1 - worst cosine);
  2. rank the groups from least to most damaging and find, by bisection, the longest
     prefix whose combined model passes the gate with a margin;
  3. greedy: try each remaining group on top; keep it if the model still passes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from trtpack.cases import Case
from trtpack.precision.int8.surrogates import (
    ModelCandidate,
    NodeGroup,
    SurrogateBuilder,
    ToggledCandidate,
    ToggledSurrogates,
)
from trtpack.runtimes.onnxruntime import cpu_session, run_session
from trtpack.sources.recipe import Recipe, Tolerance, VerifySettings
from trtpack.verify.sample_metrics import TOP1_METRICS, task_metric

if TYPE_CHECKING:
    import onnx


def tightened(recipe: Recipe, precision: str, margin: float) -> Recipe:
    """The recipe with its cosine gates moved ``margin`` of the way towards 1.0."""
    if margin <= 0:
        return recipe
    per_output: dict[str, dict[str, Tolerance]] = {
        k: dict(v) for k, v in recipe.verify.per_output.items()
    }
    for out in recipe.outputs:
        tol = recipe.verify.tolerance(precision, out.name)
        if tol.min_cosine is not None:
            stricter = 1.0 - (1.0 - tol.min_cosine) * (1.0 - margin)
            per_output.setdefault(out.name, {})[precision] = tol.model_copy(
                update={"min_cosine": stricter})
    verify = VerifySettings.model_validate(
        {**recipe.verify.model_dump(), "per_output": {
            k: {p: t.model_dump() for p, t in v.items()} for k, v in per_output.items()}})
    return recipe.model_copy(update={"verify": verify})


@dataclass
class Score:
    passed: bool
    worst: float | None  # worst task metric over cases and outputs (cosine or top-1)
    damage: float  # 1 - worst cosine of any output (continuous, for ranking)
    reasons: list[str] = field(default_factory=list)


def score_outputs(recipe: Recipe, precision: str, cases: Sequence[Case],
                  outputs: Sequence[Mapping[str, np.ndarray]]) -> Score:
    """The recipe's gate on many cases, fast (the search's judge; the stage's verification
    rows come from polygraphy's comparator in ``compare_cases``)."""
    metric_of = {o.name: o.metric for o in recipe.outputs}
    mask_input = recipe.input_name("attention_mask")
    damage = 0.0
    worst: float | None = None
    reasons: list[str] = []
    for case, out in zip(cases, outputs, strict=True):
        for name, ref in case.outputs.items():
            got = out.get(name)
            if got is None or np.shape(got) != np.shape(ref):
                damage = 2.0
                reasons.append(f"{case.label}/{name}: missing or wrong shape")
                continue
            got = np.asarray(got, dtype=np.float64)
            want = np.asarray(ref, dtype=np.float64)
            if not np.isfinite(got).all():
                damage = 2.0
                reasons.append(f"{case.label}/{name}: non-finite outputs")
                continue
            metric = metric_of.get(name, "none")
            tol = recipe.verify.tolerance(precision, name)
            cosine_kind = metric if metric in ("cosine", "pooled_cosine") else "cosine"
            cosine = task_metric(cosine_kind, want, got, case.inputs, mask_input)
            damage = max(damage, 1.0 - cosine if cosine is not None else 0.0)
            value = task_metric(metric, want, got, case.inputs, mask_input)
            if value is not None:
                worst = value if worst is None else min(worst, value)
            if metric in ("cosine", "pooled_cosine") and tol.min_cosine is not None \
                    and value is not None and value < tol.min_cosine:
                reasons.append(f"{case.label}/{name}: cosine {value:.6f} < {tol.min_cosine}")
            if metric in TOP1_METRICS and tol.min_top1 is not None \
                    and value is not None and value < tol.min_top1:
                reasons.append(f"{case.label}/{name}: top-1 {value:.4f} < {tol.min_top1}")
            if tol.atol is not None or tol.rtol is not None:
                diff = np.abs(got - want)
                ok = np.zeros(diff.shape, dtype=bool)
                if tol.atol is not None:
                    ok |= diff <= tol.atol
                if tol.rtol is not None:
                    ok |= diff <= tol.rtol * np.abs(want)
                if not ok.all():
                    reasons.append(f"{case.label}/{name}: max abs diff {diff.max():.3g} over "
                                   f"atol {tol.atol} / rtol {tol.rtol}")
    return Score(not reasons, worst, damage, reasons)


def run_model(model: onnx.ModelProto | Path, feeds: Sequence[Mapping[str, np.ndarray]],
              threads: int | None = None) -> list[dict[str, np.ndarray]]:
    """ONNX Runtime CPU outputs of an in-memory model (or a path) for each feed."""
    return run_session(cpu_session(model, threads), feeds)


def evaluation_workers() -> int:
    """Evaluations the search runs at a time: one per core (at most 4), each in one ONNX
    Runtime thread. Its batches are small (a few short samples): on 2 cores two
    single-threaded runs side by side take about half the time of one run on both, with the
    same results."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


class Evaluator:
    """Scores candidate models on fixed cases (inputs + FP32 reference outputs); may be
    called from several threads (``workers`` at a time).

    With ``fail_fast`` the cases are run ``workers`` at a time and a candidate is failed at
    the first failing case (the pass/fail verdict is the same; a failed score's ``worst``
    and ``damage`` then cover the cases run so far): a search judge, not a ranking."""

    def __init__(self, recipe: Recipe, precision: str, cases: Sequence[Case],
                 margin: float = 0.0, fail_fast: bool = False, workers: int = 1,
                 spread_rank: int = 0) -> None:
        self.recipe = recipe
        self.spread_rank = spread_rank
        self.precision = precision
        self.cases = list(cases)
        self.margin = margin
        self.fail_fast = fail_fast
        self.workers = workers
        self.gate = tightened(recipe, precision, margin)
        self.evaluations = 0
        self._count = threading.Lock()

    def __call__(self, model: onnx.ModelProto | Path | ToggledCandidate) -> Score:
        with self._count:
            self.evaluations += 1
        candidate = model if isinstance(model, ToggledCandidate) \
            else ModelCandidate(cpu_session(model))
        if not self.fail_fast:
            outputs = candidate.run([c.inputs for c in self.cases])
            return score_outputs(self.gate, self.precision, self.cases, outputs)

        def score(case: Case) -> Score:
            return score_outputs(self.gate, self.precision, [case], candidate.run([case.inputs]))

        scores: list[Score] = []
        with ThreadPoolExecutor(self.workers) as pool:
            for start in range(0, len(self.cases), self.workers):
                scores.extend(pool.map(score, self.cases[start:start + self.workers]))
                if not all(sc.passed for sc in scores):
                    break
        worst = [sc.worst for sc in scores if sc.worst is not None]
        reasons = [r for sc in scores for r in sc.reasons]
        if not reasons and self.spread_rank:
            reasons = self.spread_reasons(scores)
        return Score(not reasons, min(worst) if worst else None,
                     max(sc.damage for sc in scores), reasons)

    def spread_reasons(self, scores: Sequence[Score]) -> list[str]:
        """The margin from the spread of the worst cases: the lowest case's cosine, less the
        gap up to the ``spread_rank``-th lowest, must still meet the gate. Near the tail the
        gaps between successive lowest samples are about the size of the gap to the next,
        unseen one (the endpoint estimate X(1) - (X(k+1) - X(1))): a tight tail needs little
        room, a lone bad sample much."""
        gates = [self.gate.verify.tolerance(self.precision, o.name).min_cosine
                 for o in self.recipe.outputs if o.metric in ("cosine", "pooled_cosine")]
        floor = max((g for g in gates if g is not None), default=None)
        lows = sorted(1.0 - sc.damage for sc in scores)
        if floor is None or len(lows) <= self.spread_rank:
            return []
        spread = lows[self.spread_rank] - lows[0]
        if lows[0] - spread >= floor:
            return []
        return [f"worst cosine {lows[0]:.6f} less the spread of the worst cases "
                f"({spread:.6f}) < {floor:.6f}"]


class Trial(TypedDict):
    """One surrogate the selection judged."""

    quantized_groups: int
    worst: float | None
    damage: float
    passed: bool


@dataclass
class Sensitivity:
    group: NodeGroup
    damage: float
    worst: float | None


@dataclass
class Selection:
    quantized_groups: list[NodeGroup]
    excluded: list[str]  # node names kept in high precision
    score: Score | None
    history: list[Trial] = field(default_factory=list)


Progress = Callable[[str], None]


def measure_sensitivity(builder: SurrogateBuilder | ToggledSurrogates, groups: Sequence[NodeGroup],
                        evaluate: Evaluator, progress: Progress) -> list[Sensitivity]:
    """Damage of quantizing each group alone, least damaging first (``evaluate.workers``
    groups measured at a time)."""
    all_nodes = [n for g in groups for n in g.nodes]

    def measure(group: NodeGroup) -> Sensitivity:
        mine = set(group.nodes)
        score = evaluate(builder.build(n for n in all_nodes if n not in mine))
        return Sensitivity(group, score.damage, score.worst)

    found: list[Sensitivity] = []
    with ThreadPoolExecutor(evaluate.workers) as pool:
        for i, sensitivity in enumerate(pool.map(measure, groups), 1):
            found.append(sensitivity)
            if i % 8 == 0 or i == len(groups):
                progress(f"sensitivity: {i}/{len(groups)} node groups measured")
    return sorted(found, key=lambda s: s.damage)


def select_groups(builder: SurrogateBuilder | ToggledSurrogates, ranked: Sequence[Sensitivity],
                  evaluate: Evaluator, progress: Progress, max_evaluations: int,
                  greedy_failures: int = 6) -> Selection:
    """The most groups (least damaging first) whose combined surrogate passes ``evaluate``."""
    order = [s.group for s in ranked]
    all_nodes = [n for g in order for n in g.nodes]
    history: list[Trial] = []
    budget = [max_evaluations]

    def trial(quantized: Sequence[NodeGroup]) -> Score:
        on = {n for g in quantized for n in g.nodes}
        score = evaluate(builder.build(n for n in all_nodes if n not in on))
        budget[0] -= 1
        history.append({"quantized_groups": len(quantized), "worst": score.worst,
                        "damage": round(score.damage, 6), "passed": score.passed})
        return score

    best_score: Score | None = None
    lo, hi = 0, len(order)  # invariant: prefix lo passes (0: nothing quantized), hi fails
    full = trial(order)
    if full.passed:
        return Selection(list(order), [], full, history)
    while hi - lo > 1 and budget[0] > 0:
        mid = (lo + hi) // 2
        score = trial(order[:mid])
        if score.passed:
            lo, best_score = mid, score
        else:
            hi = mid
    progress(f"search: the {lo} least sensitive of {len(order)} node groups pass together")
    chosen = list(order[:lo])
    failures = 0
    for group in order[lo + 1:]:
        if budget[0] <= 0 or failures >= greedy_failures:
            break
        score = trial([*chosen, group])
        if score.passed:
            chosen.append(group)
            best_score = score
            failures = 0
        else:
            failures += 1
    on = {n for g in chosen for n in g.nodes}
    return Selection(chosen, [n for n in all_nodes if n not in on], best_score, history)
