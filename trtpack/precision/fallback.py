"""The INT8 fallback: the measured search for the node groups to keep in high precision
(``trtpack.precision.search``), run on surrogates of the first quantized model, round after
round with a growing margin until the chosen model passes its verification."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from trtpack.precision.conversion import Attempt, format_metric
from trtpack.precision.metrics import FallbackSummary, SearchRound, SensitivityRow

if TYPE_CHECKING:
    from trtpack.precision.int8 import Int8Conversion


# Op types quantized by the fallback (ModelOpt's default also quantizes Add inputs, which
# costs MiniLM the most accuracy, measured one node group at a time).
FALLBACK_QUANTIZE_OP_TYPES = ["MatMul", "Gemm", "Conv"]

# The search aims this share of (1 - min_cosine) above the gate, so that its choice, made
# on the held-out calibration samples and the profile corners, holds on unseen inputs.
SEARCH_MARGIN = 0.5

# The INT8 search decides node by node (True) or per shared activation (Q/K/V together).
SEARCH_PER_NODE = True

# The greedy step tries every group left after the bisection, until this many in a row
# fail (a toggled evaluation is one ONNX Runtime run, so trying them all is cheap).
GREEDY_FAILURES = 64

# Conversions after the first one that the INT8 fallback may spend.
MAX_INT8_ROUNDS = 3

# ONNX Runtime runs the search spends at most (each a few seconds on MiniLM).
MAX_SEARCH_EVALUATIONS = 60


def int8_fallback(conv: Int8Conversion, first: Attempt, user_excluded: list[str],
                  op_types: list[str]) -> tuple[Attempt, FallbackSummary]:
    """The measured search (``trtpack.precision.search``) for the node groups to keep in
    high precision, on surrogates of ``first``; up to ``MAX_INT8_ROUNDS`` rounds, the margin
    raised when a round's choice fails its verification."""
    import onnx

    from trtpack.onnx_files import save_model
    from trtpack.precision.graph import int8_quantized_nodes
    from trtpack.precision.search import Evaluator, measure_sensitivity, select_groups
    from trtpack.precision.surrogates import SurrogateBuilder, ToggledSurrogates, node_groups

    s = conv.settings
    started = time.perf_counter()
    fp32 = conv.fp32_model or onnx.load(str(conv.quantize_source))
    quantized = onnx.load(str(first.path))
    candidates = sorted(int8_quantized_nodes(quantized) - set(user_excluded))
    groups = node_groups(fp32, candidates, per_node=SEARCH_PER_NODE)
    for g in groups:
        g.hints = [conv.display(n) if n in conv.module_paths else h
                   for n, h in zip(g.nodes, g.hints, strict=True)]
    builder = SurrogateBuilder(quantized, fp32)
    workers = conv.workers
    toggled = ToggledSurrogates(quantized, fp32, groups, threads=1)
    opt_cases = [c for c in conv.cases if c.corner == "opt"] or conv.cases[:1]
    judged_corners = [c for c in conv.cases if c.corner != "max"] or conv.cases
    quick = Evaluator(conv.recipe, "int8", conv.search or opt_cases, workers=workers)
    conv.ctx.progress(f"fallback: measuring the sensitivity of {len(groups)} node groups "
                      f"({len(candidates)} quantized nodes)")
    ranked = measure_sensitivity(toggled, groups, quick, conv.ctx.progress)
    evaluations = quick.evaluations
    margin = SEARCH_MARGIN
    final = first
    history: list[SearchRound] = []
    tried: set[tuple[str, ...]] = set()
    rounds = 0
    while rounds < MAX_INT8_ROUNDS:
        rounds += 1
        # the largest corner is left to the final verification (it costs the most)
        # the search split first: most candidates that fail, fail there
        judge = Evaluator(conv.recipe, "int8", [*conv.search, *judged_corners], margin,
                          fail_fast=True, workers=workers)
        conv.ctx.progress(f"fallback round {rounds}: searching the node groups to keep "
                          f"quantized (target margin {margin:.2f})")
        selection = select_groups(toggled, ranked, judge, conv.ctx.progress,
                                  MAX_SEARCH_EVALUATIONS, GREEDY_FAILURES)
        evaluations += judge.evaluations
        excluded = [*user_excluded, *selection.excluded]
        key = tuple(sorted(excluded))
        if key in tried:
            margin = 1.0 - (1.0 - margin) / 2
            continue
        tried.add(key)
        label = f"fallback{rounds}"
        if s.high_precision == "fp32":
            # the surrogate is the model ModelOpt builds with these nodes excluded
            out_dir = conv.work / label
            out_dir.mkdir()
            save_model(builder.build(selection.excluded), out_dir / "model.onnx")
            final = conv.judge(label, out_dir / "model.onnx", excluded)
        else:
            final = conv.convert(label, op_types, excluded, s.high_precision)
        history.append(SearchRound(rounds, round(margin, 4), len(selection.quantized_groups),
                                   len(excluded), final.summary()))
        conv.ctx.progress(f"fallback round {rounds}: {len(selection.excluded)} nodes kept "
                          f"in {s.high_precision}, worst sample {format_metric(final.worst)}, "
                          f"{'passed' if final.passed else 'failed'}")
        if final.passed:
            break
        margin = 1.0 - (1.0 - margin) / 2
    sensitivity = [SensitivityRow(r.group.hints, r.group.nodes, float(f"{r.damage:.3g}"),
                                  None if r.worst is None else round(r.worst, 6),
                                  r.group in selection.quantized_groups) for r in ranked]
    return final, FallbackSummary("auto", rounds, evaluations,
                                  round(time.perf_counter() - started, 2), len(groups),
                                  sensitivity, history)
