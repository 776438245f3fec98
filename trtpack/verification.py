"""Comparing a candidate's outputs with a reference's, case by case, output by output.

The elementwise statistics (max abs/rel diff, tolerance check) come from polygraphy's
comparator; the task metrics (cosine of embeddings, top-1 agreement) are computed here
because they need the task's shape (pooling over the sequence with the attention mask).
polygraphy and onnxruntime are imported inside the functions that need them.

Per-sample metrics (every gate judges the worst sample, not a batch)
--------------------------------------------------------------------
A *sample* is one row along the output's first axis (the batch axis), judged on its
unpadded part only (the attention mask, when the model has one). A task metric is a
``SampleMetric``: a plain function

    metric(reference, candidate, inputs, mask_input) -> np.ndarray of shape [samples]

returning one value per sample, higher is better (a cosine, an agreement fraction).
``SAMPLE_METRICS`` maps the metric names of a recipe's outputs (``OutputSpec.metric``) to
these functions; a new metric (e.g. a head-specific one) is one more function registered
there, plus the tolerance field its gate reads in ``gate_threshold``.
``sample_scores`` turns the values into a ``SampleScores`` (worst, mean, worst index), and
``compare_cases`` gates on the worst sample of every case, with the mean and the worst
sample's text (trimmed) beside it in the ``VerificationRow``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
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


# metric(reference, candidate, inputs, mask_input name) -> one value per sample (axis 0)
SampleMetric = Callable[[np.ndarray, np.ndarray, Mapping[str, np.ndarray], "str | None"],
                        np.ndarray]


def _token_mask(ref: np.ndarray, inputs: Mapping[str, np.ndarray], mask_input: str | None
                ) -> np.ndarray | None:
    """The [batch, seq] mask of real tokens when ``ref`` is [batch, seq, ...] and the model
    has an attention mask of that shape; else None (every position counts)."""
    mask = inputs.get(mask_input) if mask_input else None
    if mask is None or ref.ndim < 3 or mask.shape != ref.shape[:2]:
        return None
    return np.asarray(mask) != 0


def _per_sample(ref: np.ndarray) -> bool:
    return ref.ndim >= 2


def pooled_cosine_per_sample(ref: np.ndarray, out: np.ndarray,
                             inputs: Mapping[str, np.ndarray], mask_input: str | None
                             ) -> np.ndarray:
    """Cosine of each sample's mean-pooled embedding (over its unpadded tokens)."""
    if ref.ndim == 3:
        mask = inputs.get(mask_input) if mask_input else None
        if mask is not None and mask.shape != ref.shape[:2]:
            mask = None
        return np.asarray(_cosine(mean_pool(ref, mask), mean_pool(out, mask)))
    return cosine_per_sample(ref, out, inputs, mask_input)


def cosine_per_sample(ref: np.ndarray, out: np.ndarray, inputs: Mapping[str, np.ndarray],
                      mask_input: str | None) -> np.ndarray:
    """Each sample's worst vector cosine: over its unpadded positions for [batch, seq, dim],
    its own row for [batch, dim]."""
    if not _per_sample(ref):
        return np.asarray([_cosine(_rows(ref), _rows(out)).min()])
    a = ref.astype(np.float64).reshape(ref.shape[0], -1, ref.shape[-1])
    b = out.astype(np.float64).reshape(out.shape[0], -1, out.shape[-1])
    cos = _cosine(a, b)  # [batch, positions]
    mask = _token_mask(ref, inputs, mask_input)
    if mask is not None and ref.ndim == 3:
        cos = np.where(mask, cos, np.inf)
        worst = cos.min(axis=1)
        return np.where(np.isfinite(worst), worst, 1.0)
    return np.asarray(cos.min(axis=1))


def top1_per_sample(ref: np.ndarray, out: np.ndarray, inputs: Mapping[str, np.ndarray],
                    mask_input: str | None) -> np.ndarray:
    """Each sample's share of (unpadded) positions whose argmax agrees: 1 or 0 for a
    [batch, classes] output, a fraction of its tokens for [batch, seq, vocab]."""
    if not _per_sample(ref):
        return np.asarray([float(ref.argmax() == out.argmax())])
    agree = (ref.argmax(-1) == out.argmax(-1)).astype(np.float64)
    agree = agree.reshape(ref.shape[0], -1)
    mask = _token_mask(ref, inputs, mask_input)
    if mask is not None and ref.ndim == 3:
        counted = mask.reshape(ref.shape[0], -1).astype(np.float64)
        return np.asarray((agree * counted).sum(1) / np.maximum(counted.sum(1), 1.0))
    return np.asarray(agree.mean(axis=1))


def span_per_sample(ref: np.ndarray, out: np.ndarray, inputs: Mapping[str, np.ndarray],
                    mask_input: str | None) -> np.ndarray:
    """Question answering's start_logits / end_logits ([batch, seq]): 1.0 per sample when
    the argmax position over its unpadded tokens agrees (both agree = the same answer
    span). Another layout falls back to top-1 per row."""
    mask = inputs.get(mask_input) if mask_input else None
    if ref.ndim != 2 or mask is None or mask.shape != ref.shape:
        return top1_per_sample(ref, out, inputs, mask_input)
    real = np.asarray(mask) != 0
    low = np.finfo(np.float64).min
    r = np.where(real, ref.astype(np.float64), low).argmax(-1)
    o = np.where(real, out.astype(np.float64), low).argmax(-1)
    return (r == o).astype(np.float64)


# token_top1 is the argmax at every unpadded token (LMs, token classification), which
# top1_per_sample computes per sample
SAMPLE_METRICS: dict[str, SampleMetric] = {
    "pooled_cosine": pooled_cosine_per_sample,
    "cosine": cosine_per_sample,
    "top1": top1_per_sample,
    "token_top1": top1_per_sample,
    "span": span_per_sample,
}


@dataclass(frozen=True)
class SampleScores:
    """A metric's value for each sample of a case (higher is better)."""

    values: np.ndarray

    @property
    def worst_index(self) -> int:
        return int(np.argmin(np.where(np.isnan(self.values), -np.inf, self.values)))

    @property
    def worst(self) -> float:
        return float(self.values[self.worst_index])

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    def failing(self, threshold: float) -> list[int]:
        """Indices of the samples below ``threshold`` (NaN counts as failing)."""
        return [int(i) for i in np.flatnonzero(~(self.values >= threshold))]


def sample_scores(metric: str, ref: np.ndarray, out: np.ndarray,
                  inputs: Mapping[str, np.ndarray], mask_input: str | None
                  ) -> SampleScores | None:
    """Per-sample values of ``metric`` (None for a metric-less output)."""
    fn = SAMPLE_METRICS.get(metric)
    if fn is None:
        return None
    return SampleScores(np.asarray(fn(np.asarray(ref), np.asarray(out), inputs, mask_input),
                                   dtype=np.float64))


def gate_threshold(metric: str, tol: Tolerance) -> float | None:
    """The lowest passing per-sample value of ``metric`` under ``tol`` (None: not gated)."""
    if metric in ("cosine", "pooled_cosine"):
        return tol.min_cosine
    if metric in TOP1_METRICS:
        return tol.min_top1
    return None


def task_metric(metric: str, ref: np.ndarray, out: np.ndarray,
                inputs: Mapping[str, np.ndarray], mask_input: str | None) -> float | None:
    """The task metric of one output: its worst sample's value."""
    scores = sample_scores(metric, ref, out, inputs, mask_input)
    return None if scores is None else scores.worst


def trim_text(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


# (case inputs, sample index) -> the sample's text, for reports (None when unknown)
SampleText = Callable[[Mapping[str, np.ndarray], int], "str | None"]


def token_text(tokenizer: Any, ids_input: str, mask_input: str | None) -> SampleText:
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


def _gate(tol: Tolerance, metric: str, scores: SampleScores | None, max_abs: float,
          within_tolerance: bool) -> tuple[bool, str]:
    reasons = []
    if (tol.atol is not None or tol.rtol is not None) and not within_tolerance:
        reasons.append(f"max abs diff {max_abs:.3g} over atol {tol.atol} / rtol {tol.rtol}")
    threshold = gate_threshold(metric, tol)
    if scores is not None and threshold is not None:
        failing = scores.failing(threshold)
        if failing:
            name = "top-1 agreement" if metric in TOP1_METRICS else "cosine"
            reasons.append(
                f"{len(failing)} of {len(scores.values)} samples below {threshold}: worst "
                f"sample {scores.worst_index} {name} {scores.worst:.6f} "
                f"(mean {scores.mean:.6f})")
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
                            named.append(f"#{i} {scores.values[i]:.4f} \"{trim_text(said, 60)}\"")
                    if named:
                        reason += "; failing samples: " + ", ".join(named)
                rows.append(VerificationRow(
                    check, case.profile, case.corner, case.shapes, name, max_abs, max_rel,
                    metric, None if scores is None else scores.worst, passed, reason,
                    metric_mean=None if scores is None else scores.mean,
                    samples=None if scores is None else len(scores.values),
                    worst_sample=None if scores is None else scores.worst_index,
                    worst_text=text))
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
    from polygraphy.backend.onnxrt import OnnxrtRunner

    from trtpack.runtimes.onnxruntime import cpu_session

    session = cpu_session(model_path, threads)
    outputs: list[dict[str, np.ndarray]] = []
    with quiet_polygraphy(), OnnxrtRunner(session) as runner:
        input_names = {i.name for i in session.get_inputs()}
        for case in cases:
            feed = {k: v for k, v in case.inputs.items() if k in input_names}
            outputs.append({k: np.asarray(v) for k, v in runner.infer(feed).items()})
    return outputs
