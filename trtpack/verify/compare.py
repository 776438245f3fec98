"""Comparing a candidate's outputs with a reference's, case by case, output by output.

The elementwise statistics (max abs/rel diff, tolerance check) come from polygraphy's
comparator; the task metrics (cosine of embeddings, top-1 agreement) are judged per sample
(``trtpack.verify.sample_metrics``) because they need the task's shape (pooling over the sequence
with the attention mask). ``compare_cases`` gates on the worst sample of every case, with
the mean and the worst sample's text (trimmed) beside it in the ``VerificationRow``.
polygraphy and onnxruntime are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trtpack.cases import Case
from trtpack.report import VerificationRow, shown_metric
from trtpack.sources.recipe import Recipe, Tolerance
from trtpack.verify.sample_metrics import (
    SampleScores,
    gate_threshold,
    metric_label,
    sample_scores,
)
from trtpack.verify.samples import TokenDecoder

if TYPE_CHECKING:
    import torch
    from polygraphy.comparator.compare import OutputCompareResult
    from polygraphy.comparator.struct import AccuracyResults


def _is_loaded_torch_tensor(obj: np.ndarray | torch.Tensor) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


@contextlib.contextmanager
def quiet_polygraphy() -> Iterator[None]:
    """Polygraphy logs to stdout; the library never prints, so silence it while in use.

    Also: polygraphy asks of every array whether it is a torch tensor by importing torch
    (seconds and hundreds of MB in processes that never use torch: verify, precision). An object
    can only be a torch tensor when torch is loaded already, so it asks that instead.

    And while it is silent, polygraphy's output statistics for its log are not computed:
    ``log_output_stats`` and ``log_compared_output_stats`` build their INFO lines (mean,
    median, p90/p95/p99 of each output and of both differences) before the logger drops
    them, most of a large output's comparison time. The comparison's own statistics
    (``OutputCompareResult``) are kept."""
    from polygraphy.comparator import util as compare_util
    from polygraphy.logger import G_LOGGER
    from polygraphy.util import array

    array.is_torch = _is_loaded_torch_tensor

    saved = G_LOGGER.module_severity
    logged = compare_util.log_output_stats, compare_util.log_compared_output_stats
    G_LOGGER.module_severity = G_LOGGER.CRITICAL
    compare_util.log_output_stats = _not_logged
    compare_util.log_compared_output_stats = _not_logged
    try:
        yield
    finally:
        G_LOGGER.module_severity = saved
        compare_util.log_output_stats, compare_util.log_compared_output_stats = logged


def _not_logged(*args: object, **kwargs: object) -> None:
    """What polygraphy's statistics loggers do under ``quiet_polygraphy``: nothing (their
    lines are INFO, below the severity it sets)."""


def trim_text(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


# (case inputs, sample index) -> the sample's text, for reports (None when unknown)
SampleText = Callable[[Mapping[str, np.ndarray], int], "str | None"]


def token_text(tokenizer: TokenDecoder, ids_input: str, mask_input: str | None) -> SampleText:
    """A ``SampleText`` decoding a sample's unpadded token ids with the model's tokenizer."""

    def describe(inputs: Mapping[str, np.ndarray], index: int) -> str | None:
        ids = inputs.get(ids_input)
        if ids is None or ids.ndim != 2 or index >= ids.shape[0]:
            return None
        row = ids[index]
        mask = inputs.get(mask_input) if mask_input else None
        if mask is not None and mask.shape == ids.shape:
            row = row[mask[index] != 0]
        try:
            return str(tokenizer.decode([int(t) for t in row], skip_special_tokens=True))
        except Exception:  # a tokenizer that cannot decode these ids: no text, no failure
            return None

    return describe


def saved_tokenizer_text(folder: Path | None, recipe: Recipe) -> SampleText | None:
    """A ``SampleText`` from the tokenizer the export saved in ``folder`` (None: the model
    takes no token ids, or there is no tokenizer). ``tokenizer.json`` is read with
    ``tokenizers`` alone (no transformers import in the verify process)."""
    from trtpack.sources.tokenizer_files import has_tokenizer

    ids, mask = recipe.input_name("token_ids"), recipe.input_name("attention_mask")
    if ids is None or folder is None or not has_tokenizer(folder):
        return None
    tokenizer: TokenDecoder
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return token_text(tokenizer, ids, mask)


def _gate(tol: Tolerance, metric: str, scores: SampleScores | None, max_abs: float,
          within_tolerance: bool) -> tuple[bool, str]:
    reasons = []
    # a generic output's scaled error is its elementwise check, judged per sample
    elementwise = metric not in ("scaled_error", "data_dependent")
    if elementwise and (tol.atol is not None or tol.rtol is not None) and not within_tolerance:
        reasons.append(f"max abs diff {max_abs:.3g} over atol {tol.atol} / rtol {tol.rtol}")
    threshold = gate_threshold(metric, tol)
    if scores is not None and threshold is not None:
        failing = scores.failing(threshold)
        if failing:
            name = metric_label(metric)
            reasons.append(
                f"{len(failing)} of {len(scores.values)} samples below {threshold}: worst "
                f"sample {scores.worst_index} {name} "
                f"{shown_metric(scores.worst, threshold, digits=6)} < {threshold} "
                f"(mean {shown_metric(scores.mean, threshold, digits=6)})")
    if not np.isfinite(max_abs):
        reasons.append("non-finite outputs (overflow?)")
    return (not reasons), "; ".join(reasons)


def compare_cases(
    check: str,
    recipe: Recipe,
    precision: str,
    references: Sequence[Case],
    candidates: Sequence[Mapping[str, np.ndarray]],
    sample_text: SampleText | None = None,
) -> list[VerificationRow]:
    """One row per case and output: polygraphy's diff statistics plus the task metric,
    judged per sample (the row's ``metric_value`` is the worst sample's, the mean beside it,
    and ``sample_text`` names the worst sample's text when given)."""
    from polygraphy.comparator import Comparator, RunResults, SimpleCompareFunc
    from polygraphy.comparator.struct import IterationResult

    metric_of = {o.name: o.metric for o in recipe.outputs}
    mask_input = recipe.input_name("attention_mask")
    rows: list[VerificationRow] = []
    with quiet_polygraphy():
        for case, candidate in zip(references, candidates, strict=True):
            atol = {"": 0.0}
            rtol = {"": 0.0}
            for name in case.outputs:
                tol = recipe.verify.tolerance(precision, name)
                gated = tol.atol is not None or tol.rtol is not None
                atol[name] = tol.atol if tol.atol is not None else (0.0 if gated else np.inf)
                rtol[name] = tol.rtol if tol.rtol is not None else (0.0 if gated else np.inf)
            ref_outputs = {k: np.asarray(v, dtype=np.float32) for k, v in case.outputs.items()}
            cand_outputs = {k: np.asarray(candidate[k], dtype=np.float32) for k in case.outputs
                            if k in candidate}
            results = RunResults()
            results.append(("reference", [IterationResult(ref_outputs, runner_name="reference")]))
            results.append(("candidate", [IterationResult(cand_outputs, runner_name="candidate")]))
            func = SimpleCompareFunc(atol=atol, rtol=rtol, check_error_stat="elemwise")
            accuracy = Comparator.compare_accuracy(results, compare_func=func)
            per_output = _per_output_results(accuracy)
            for name, ref in case.outputs.items():
                metric = metric_of.get(name, "none")
                tol = recipe.verify.tolerance(precision, name)
                if name not in candidate:
                    rows.append(VerificationRow(check, case.profile, case.corner, case.shapes,
                                                name, np.inf, np.inf, metric, None, False,
                                                "output missing"))
                    continue
                out = np.asarray(candidate[name])
                if out.shape != ref.shape and metric == "data_dependent":
                    rows.append(VerificationRow(
                        check, case.profile, case.corner, case.shapes, name, np.nan, np.nan,
                        metric, None, True, f"not verified: '{name}' has a data-dependent "
                        f"shape ({out.shape} here, {ref.shape} in the reference)"))
                    continue
                if out.shape != ref.shape:
                    rows.append(VerificationRow(
                        check, case.profile, case.corner, case.shapes, name, np.inf, np.inf,
                        metric, None, False, f"shape {out.shape} != reference {ref.shape}"))
                    continue
                stats = per_output.get(name)
                max_abs = float(stats.max_absdiff) if stats is not None else np.inf
                max_rel = float(stats.max_reldiff) if stats is not None else np.inf
                within = bool(stats) if stats is not None else False
                scores = sample_scores(metric, ref, out, case.inputs, mask_input)
                passed, reason = _gate(tol, metric, scores, max_abs, within)
                text = None
                if scores is not None and sample_text is not None:
                    found = sample_text(case.inputs, scores.worst_index)
                    text = trim_text(found) if found is not None else None
                    threshold = gate_threshold(metric, tol)
                    failing = scores.failing(threshold) if threshold is not None else []
                    named = []
                    for i in sorted(failing, key=lambda i: scores.values[i])[:5]:
                        said = sample_text(case.inputs, i)
                        if said is not None:
                            named.append(f"#{i} {shown_metric(scores.values[i], threshold)} "
                                         f"\"{trim_text(said, 60)}\"")
                    if named:
                        reason += "; failing samples: " + ", ".join(named)
                rows.append(VerificationRow(
                    check, case.profile, case.corner, case.shapes, name, max_abs, max_rel,
                    metric, None if scores is None else scores.worst, passed, reason,
                    metric_mean=None if scores is None else scores.mean,
                    samples=None if scores is None else len(scores.values),
                    worst_sample=None if scores is None else scores.worst_index,
                    worst_text=text,
                    threshold=None if scores is None else gate_threshold(metric, tol)))
    return rows


def _per_output_results(accuracy: AccuracyResults) -> dict[str, OutputCompareResult]:
    """Flatten polygraphy's AccuracyResults into {output name: OutputCompareResult}."""
    found: dict[str, OutputCompareResult] = {}
    for result in accuracy:
        for iteration in result.values() if hasattr(result, "values") else []:
            for per_iter in iteration:
                for name, compared in per_iter.items():
                    found[name] = compared
    return found


def run_onnxruntime(model_path: Path, cases: Sequence[Case], threads: int | None = None
                    ) -> list[dict[str, np.ndarray]]:
    """Run an ONNX model on each case's inputs in ONNX Runtime (CPU). (Not through
    polygraphy's runner: it imports torch to ask whether each output is a torch tensor.) The
    session is made for a few runs (``cpu_session``'s ``few_runs``), its weights pre-packed
    when the runs are long (``few_runs_prepacked``)."""
    from trtpack.runtimes.onnxruntime import cpu_session, few_runs_prepacked, run_session

    feeds = [c.inputs for c in cases]
    outputs = run_session(cpu_session(model_path, threads, few_runs=True,
                                      prepacked=few_runs_prepacked(feeds)), feeds)
    return [{k: np.asarray(v) for k, v in out.items()} for out in outputs]
