"""The INT8 fallback: the measured search for the node groups to keep in high precision
(``trtpack.precision.int8.search``), run on surrogates of the first quantized model.

The search decides on every sample that is neither check nor held-out (calibration and
search splits, plus 1-4 word prefixes of their lines): sensitivity and selection alike.
Each round's choice is verified, then the check split is consulted. When the check split
fails, the next round goes on more conservatively: only groups the failed choice kept
may stay quantized, the check's failing samples join the decision samples, and the
margin grows. The held-out split (the certifying part) is judged once, after the search,
by ``Int8Conversion.run``: no decision ever used it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from trtpack.cases import Case
from trtpack.precision.conversion import Attempt, format_metric
from trtpack.precision.graph import COMPUTE_OP_TYPES, int8_quantized_nodes, low_precision_stats
from trtpack.precision.metrics import FallbackSummary, SearchRound, SensitivityRow
from trtpack.sources.recipe import Recipe

if TYPE_CHECKING:
    import onnx

    from trtpack.precision.int8.search import Sensitivity

# Op types INT8 quantizes when the recipe's quantize_op_types is empty, with or without the
# fallback (ModelOpt's default also quantizes Add inputs, which costs MiniLM the most
# accuracy, measured one node group at a time).
FALLBACK_QUANTIZE_OP_TYPES = list(COMPUTE_OP_TYPES)

# The search's judge: every decision sample at or above the gate moved this share of
# (1 - min_cosine) towards 1 (the floor), and the worst sample, less the spread of the worst
# ones (the gap up to the SPREAD_RANK-th lowest), above it too (``Evaluator.spread_reasons``):
# the room a choice needs on unseen inputs comes from how its own worst samples spread, not
# from a fixed share. A fixed 0.4 kept minilm at 35/48 (73%) on long-40.txt (unseen worst
# 0.9942) and on everyday-50.txt; floor 0.1 with the spread to the third-lowest keeps 38/48
# and 36/48 there (unseen worst 0.9922, 0.9936: benchmarks/README.md).
SEARCH_MARGIN = 0.1

SPREAD_RANK = 2

# The INT8 search decides node by node (True) or per shared activation (Q/K/V together).
SEARCH_PER_NODE = True

# The greedy step tries every group left after the bisection, until this many in a row
# fail (a toggled evaluation is one ONNX Runtime run, so trying them all is cheap).
GREEDY_FAILURES = 64

# Search rounds the INT8 fallback may spend (with FP32 kept nodes a round is one surrogate
# saved and verified, not a ModelOpt conversion).
MAX_INT8_ROUNDS = 5

# ONNX Runtime runs the search spends at most (each a few seconds on MiniLM).
MAX_SEARCH_EVALUATIONS = 60

# The sensitivity of each group is measured on the first decision samples (check failures,
# short prefixes, the search split, then calibration batches) up to this many: ranking
# needs the short inputs, not every long calibration batch (on the default text, all 184
# decision samples made the sensitivity pass take 3 times longer; on long-40.txt 32 short
# samples kept the same 10 nodes FP32 as 64).
SENSITIVITY_SAMPLES = 32


@dataclass
class SearchInputs:
    """What the search decides on, handed over by the INT8 conversion
    (``trtpack.precision.int8.conversion.Int8Conversion.search_inputs``): never the held-out
    split, and the check split only through ``check_failures``."""

    recipe: Recipe
    # the FP32 model quantized, loaded when called: where kept nodes come from
    fp32_model: Callable[[], onnx.ModelProto]
    corners: list[Case]  # the profile corners
    decision: list[Case]  # neither check nor held-out, short prefixes first
    has_check: bool  # whether there is a check split to consult
    high_precision: str  # what kept nodes compute in ("fp32", "fp16")
    min_int8_share: float
    workers: int  # ONNX Runtime runs at a time
    names: dict[str, str]  # node -> its PyTorch module path and op type, where known
    progress: Callable[[str], None]


# The conversion's side of the seam. ``AttemptWith(label, excluded, surrogate)``: an attempt
# with ``excluded`` kept in high precision (the conversion saves ``surrogate()`` when that is
# the model ModelOpt would build, else converts anew), judged at the corners and on the search
# split. ``CheckFailures(attempt)``: the check split's cases ``attempt`` fails (one consultation).
AttemptWith = Callable[[str, list[str], Callable[[], "onnx.ModelProto"]], Attempt]
CheckFailures = Callable[[Attempt], list[Case]]


def first_samples(cases: Sequence[Case], samples: int) -> list[Case]:
    """The first ``cases`` holding ``samples`` rows (the last one may pass it)."""
    taken: list[Case] = []
    rows = 0
    for case in cases:
        if rows >= samples:
            break
        taken.append(case)
        rows += len(next(iter(case.inputs.values())))
    return taken


def conservative_share(ranked: Sequence[Sensitivity], quantized: onnx.ModelProto, min_share: float
                       ) -> set[str]:
    """The fewest of the least sensitive groups' nodes (``ranked``, least damaging first)
    that keep ``min_share`` of the quantized model's Conv/MatMul/Gemm nodes INT8 (counted as
    ``check_int8_share`` counts them)."""
    total = low_precision_stats(quantized, "int8").total
    compute = {n.name for n in quantized.graph.node if n.op_type in COMPUTE_OP_TYPES}
    chosen: set[str] = set()
    for row in ranked:
        if total and sum(n in compute for n in chosen) >= min_share * total:
            break
        chosen.update(row.group.nodes)
    return chosen


def int8_fallback(inputs: SearchInputs, first: Attempt, user_excluded: list[str],
                  attempt_with: AttemptWith, check_failures: CheckFailures
                  ) -> tuple[Attempt, FallbackSummary]:
    """``first`` (quantized with FP32 kept nodes) if it passes its gate and the check split;
    else the measured search (``search_groups``)."""
    consulted = first.passed and inputs.has_check
    check_failed = check_failures(first) if consulted else []
    if first.passed and not check_failed:
        return first, FallbackSummary("auto", 0, check_consultations=int(consulted))
    return search_groups(inputs, first, user_excluded, attempt_with, check_failures,
                         int(consulted), check_failed)


def search_groups(inputs: SearchInputs, first: Attempt, user_excluded: list[str],
                  attempt_with: AttemptWith, check_failures: CheckFailures,
                  consultations: int = 0, check_failed: Sequence[Case] = ()
                  ) -> tuple[Attempt, FallbackSummary]:
    """The measured search (``trtpack.precision.int8.search``) for the node groups to keep in
    high precision, on surrogates of ``first``; up to ``MAX_INT8_ROUNDS`` rounds, each more
    conservative than the last when its choice fails its verification or the check split.
    ``consultations`` / ``check_failed``: the check split already consulted on ``first``."""
    import onnx

    from trtpack.precision.int8.search import Evaluator, measure_sensitivity, select_groups
    from trtpack.precision.int8.surrogates import SurrogateBuilder, ToggledSurrogates, node_groups

    started = time.perf_counter()
    fp32 = inputs.fp32_model()
    progress = inputs.progress
    quantized = onnx.load(str(first.path))
    candidates = sorted(int8_quantized_nodes(quantized) - set(user_excluded))
    groups = node_groups(fp32, candidates, per_node=SEARCH_PER_NODE)
    for g in groups:
        g.hints = [inputs.names.get(n, h) for n, h in zip(g.nodes, g.hints, strict=True)]
    builder = SurrogateBuilder(quantized, fp32)
    workers = inputs.workers
    toggled = ToggledSurrogates(quantized, fp32, groups, threads=1)
    corners = inputs.corners
    opt_cases = [c for c in corners if c.corner == "opt"] or corners[:1]
    judged_corners = [c for c in corners if c.corner != "max"] or corners
    decision = [*check_failed, *inputs.decision]
    quick = Evaluator(inputs.recipe, "int8", first_samples(decision, SENSITIVITY_SAMPLES)
                      or opt_cases, workers=workers)
    progress(f"fallback: measuring the sensitivity of {len(groups)} node groups "
             f"({len(candidates)} quantized nodes)")
    ranked = measure_sensitivity(toggled, groups, quick, progress)
    evaluations = quick.evaluations
    margin = SEARCH_MARGIN
    final = first
    history: list[SearchRound] = []
    tried: set[tuple[str, ...]] = set()
    allowed = list(ranked)  # groups that may stay quantized, least sensitive first
    rounds = 0
    while rounds < MAX_INT8_ROUNDS:
        rounds += 1
        # the largest corner is left to the final verification (it costs the most)
        # the short prefixes first: most candidates that fail, fail there
        judge = Evaluator(inputs.recipe, "int8", [*decision, *judged_corners], margin,
                          fail_fast=True, workers=workers, spread_rank=SPREAD_RANK)
        progress(f"fallback round {rounds}: searching the node groups to keep "
                 f"quantized (target margin {margin:.2f}, {len(decision)} batches)")
        selection = select_groups(toggled, allowed, judge, progress,
                                  MAX_SEARCH_EVALUATIONS, GREEDY_FAILURES)
        evaluations += judge.evaluations
        excluded = [*user_excluded, *selection.excluded]
        key = tuple(sorted(excluded))
        if key in tried:
            margin = 1.0 - (1.0 - margin) / 2
            continue
        tried.add(key)
        # with FP32 kept nodes the surrogate is the model ModelOpt builds with them excluded
        final = attempt_with(f"fallback{rounds}", excluded,
                             partial(builder.build, selection.excluded))
        failing: list[Case] = []
        consulted = final.passed and inputs.has_check
        if consulted:
            consultations += 1
            failing = check_failures(final)
        history.append(SearchRound(rounds, round(margin, 4), len(selection.quantized_groups),
                                   len(excluded), final.summary(),
                                   not failing if consulted else None))
        worst = format_metric(final.worst, final.threshold)
        progress(f"fallback round {rounds}: {len(selection.excluded)} nodes kept "
                 f"in {inputs.high_precision}, worst sample {worst}, "
                 f"{'passed' if final.passed else 'failed'}"
                 + (f", check split: {len(failing)} failing" if consulted else ""))
        if final.passed and not failing:
            break
        # more conservative: only what this choice kept may stay quantized, the check's
        # failing samples are decided on from now, and the margin grows
        kept = {id(g) for g in selection.quantized_groups}
        allowed = [r for r in allowed if id(r.group) in kept]
        decision = [*failing, *decision]
        margin = 1.0 - (1.0 - margin) / 2
    else:
        # every round failed its verification or the check split: the most conservative
        # configuration that still meets --min-int8-share (the least sensitive groups
        # only), judged like any round, before the build gives up on INT8
        quantized_nodes = conservative_share(ranked, quantized, inputs.min_int8_share)
        excluded = [*user_excluded, *(n for r in ranked for n in r.group.nodes
                                      if n not in quantized_nodes)]
        if quantized_nodes and tuple(sorted(excluded)) not in tried:
            progress(f"fallback: no round passed; the most conservative choice: "
                     f"{len(quantized_nodes)} nodes quantized (--min-int8-share)")
            last = attempt_with("conservative", excluded, partial(builder.build, excluded))
            failing = check_failures(last) if last.passed and inputs.has_check else []
            consultations += int(last.passed and inputs.has_check)
            history.append(SearchRound(rounds + 1, 1.0, len(quantized_nodes), len(excluded),
                                       last.summary(), not failing if last.passed else None))
            if last.passed and not failing:
                final = last
    sensitivity = [SensitivityRow(r.group.hints, r.group.nodes, float(f"{r.damage:.3g}"),
                                  None if r.worst is None else round(r.worst, 6),
                                  r.group in selection.quantized_groups) for r in ranked]
    return final, FallbackSummary("auto", rounds, evaluations,
                                  round(time.perf_counter() - started, 2), len(groups),
                                  sensitivity, history, consultations,
                                  sum(len(next(iter(c.inputs.values()))) for c in decision))
