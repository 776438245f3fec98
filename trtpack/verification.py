"""Comparing a candidate's outputs with a reference's, case by case, output by output.

The elementwise statistics (max abs/rel diff, tolerance check) come from polygraphy's
comparator; the task metrics (cosine of embeddings, top-1 agreement) are computed here
because they need the task's shape (pooling over the sequence with the attention mask).
polygraphy and onnxruntime are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trtpack.cases import Case
from trtpack.recipe import Recipe, Tolerance
from trtpack.report import VerificationRow

TOP1_METRICS = ("top1", "token_top1", "span")
"""Metrics gated by ``min_top1`` (argmax agreement)."""


@contextlib.contextmanager
def quiet_polygraphy() -> Iterator[Any]:
    """Polygraphy logs to stdout; the library never prints, so silence it while in use."""
    from polygraphy.logger import G_LOGGER

    saved = G_LOGGER.module_severity
    G_LOGGER.module_severity = G_LOGGER.CRITICAL
    try:
        yield G_LOGGER
    finally:
        G_LOGGER.module_severity = saved


def _rows(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x.reshape(-1, x.shape[-1]) if x.ndim > 1 else x.reshape(1, -1)


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    num = (a * b).sum(-1)
    den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return np.where(den > 0, num / np.maximum(den, 1e-30), 1.0)


def mean_pool(hidden: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Sentence embeddings the sentence-transformers way: mean over unmasked tokens."""
    hidden = hidden.astype(np.float64)
    if mask is None:
        return hidden.mean(axis=1)
    m = mask.astype(np.float64)[..., None]
    return (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)


def _token_mask(ref: np.ndarray, inputs: Mapping[str, np.ndarray], mask_input: str | None,
                rank: int) -> np.ndarray:
    """[batch, sequence] of the positions that count: the unpadded tokens (all when the
    model has no attention mask or its shape does not match)."""
    shape = ref.shape[:rank]
    mask = inputs.get(mask_input) if mask_input else None
    if mask is None or tuple(mask.shape) != tuple(shape):
        return np.ones(shape, dtype=bool)
    return np.asarray(mask) != 0


def token_top1_per_sample(ref: np.ndarray, out: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per sample (row of the batch): the share of its unpadded tokens whose argmax over the
    last axis (vocabulary, labels) agrees. ``ref``/``out`` are [batch, sequence, classes]."""
    same = ref.argmax(-1) == out.argmax(-1)
    counted = mask.sum(axis=1)
    agree = (same & mask).sum(axis=1)
    return np.where(counted > 0, agree / np.maximum(counted, 1), 1.0)


def span_per_sample(ref: np.ndarray, out: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per sample: 1.0 when the argmax position over its unpadded tokens agrees (for
    question answering's start_logits and end_logits: both agree = the same answer span)."""
    low = np.finfo(np.float64).min
    r = np.where(mask, ref.astype(np.float64), low).argmax(-1)
    o = np.where(mask, out.astype(np.float64), low).argmax(-1)
    return (r == o).astype(np.float64)


def top1_per_sample(ref: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Per sample: 1.0 when the argmax of its row agrees (classifiers)."""
    return (_rows(ref).argmax(-1) == _rows(out).argmax(-1)).astype(np.float64)


def task_metric(metric: str, ref: np.ndarray, out: np.ndarray,
                inputs: Mapping[str, np.ndarray], mask_input: str | None) -> float | None:
    """The task metric of one output: the worst cosine, or the top-1 agreement fraction."""
    if metric == "token_top1" and ref.ndim == 3:
        tokens = _token_mask(ref, inputs, mask_input, 2)
        return float(token_top1_per_sample(ref, out, tokens).min())
    if metric == "span" and ref.ndim == 2:
        tokens = _token_mask(ref, inputs, mask_input, 2)
        return float(span_per_sample(ref, out, tokens).min())
    if metric in ("token_top1", "span"):  # another layout: top-1 per row
        return float(top1_per_sample(ref, out).min())
    if metric == "cosine":
        return float(_cosine(_rows(ref), _rows(out)).min())
    if metric == "pooled_cosine":
        mask = inputs.get(mask_input) if mask_input else None
        if ref.ndim == 3:
            return float(_cosine(mean_pool(ref, mask), mean_pool(out, mask)).min())
        return float(_cosine(_rows(ref), _rows(out)).min())
    if metric == "top1":
        return float((_rows(ref).argmax(-1) == _rows(out).argmax(-1)).mean())
    return None


def _gate(tol: Tolerance, metric: str, value: float | None, max_abs: float,
          within_tolerance: bool) -> tuple[bool, str]:
    reasons = []
    if (tol.atol is not None or tol.rtol is not None) and not within_tolerance:
        reasons.append(f"max abs diff {max_abs:.3g} over atol {tol.atol} / rtol {tol.rtol}")
    if value is not None:
        if metric in ("cosine", "pooled_cosine") and tol.min_cosine is not None \
                and value < tol.min_cosine:
            reasons.append(f"cosine {value:.6f} < {tol.min_cosine}")
        if metric in TOP1_METRICS and tol.min_top1 is not None \
                and value < tol.min_top1:
            reasons.append(f"top-1 agreement {value:.4f} < {tol.min_top1}")
    if not np.isfinite(max_abs):
        reasons.append("non-finite outputs (overflow?)")
    return (not reasons), "; ".join(reasons)


def compare_cases(
    check: str,
    recipe: Recipe,
    precision: str,
    references: Sequence[Case],
    candidates: Sequence[Mapping[str, np.ndarray]],
) -> list[VerificationRow]:
    """One row per case and output: polygraphy's diff statistics plus the task metric."""
    from polygraphy.comparator import Comparator, RunResults, SimpleCompareFunc
    from polygraphy.comparator.struct import IterationResult

    metric_of = {o.name: o.metric for o in recipe.outputs}
    mask_input = next((i.name for i in recipe.inputs if i.kind == "attention_mask"), None)
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
                if out.shape != ref.shape:
                    rows.append(VerificationRow(
                        check, case.profile, case.corner, case.shapes, name, np.inf, np.inf,
                        metric, None, False, f"shape {out.shape} != reference {ref.shape}"))
                    continue
                stats = per_output.get(name)
                max_abs = float(stats.max_absdiff) if stats is not None else np.inf
                max_rel = float(stats.max_reldiff) if stats is not None else np.inf
                within = bool(stats) if stats is not None else False
                value = task_metric(metric, ref, out, case.inputs, mask_input)
                passed, reason = _gate(tol, metric, value, max_abs, within)
                rows.append(VerificationRow(check, case.profile, case.corner, case.shapes, name,
                                            max_abs, max_rel, metric, value, passed, reason))
    return rows


def _per_output_results(accuracy: Any) -> dict[str, Any]:
    """Flatten polygraphy's AccuracyResults into {output name: OutputCompareResult}."""
    found: dict[str, Any] = {}
    for result in accuracy:
        for iteration in result.values() if hasattr(result, "values") else []:
            for per_iter in iteration:
                for name, compared in per_iter.items():
                    found[name] = compared
    return found


def run_onnxruntime(model_path: Path, cases: Sequence[Case], threads: int | None = None
                    ) -> list[dict[str, np.ndarray]]:
    """Run an ONNX model on each case's inputs with polygraphy's ONNX Runtime runner (CPU)."""
    import onnxruntime as ort
    from polygraphy.backend.onnxrt import OnnxrtRunner

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    outputs: list[dict[str, np.ndarray]] = []
    with quiet_polygraphy(), OnnxrtRunner(session) as runner:
        input_names = {i.name for i in session.get_inputs()}
        for case in cases:
            feed = {k: v for k, v in case.inputs.items() if k in input_names}
            outputs.append({k: np.asarray(v) for k, v in runner.infer(feed).items()})
    return outputs
