"""Per-sample task metrics: every gate judges the worst sample, not a batch.

A *sample* is one row along the output's first axis (the batch axis), judged on its
unpadded part only (the attention mask, when the model has one). A task metric is a
``SampleMetric``: a plain function

    metric(reference, candidate, inputs, mask_input) -> np.ndarray of shape [samples]

returning one value per sample, higher is better (a cosine, an agreement fraction).
``SAMPLE_METRICS`` maps the metric names of a recipe's outputs (``OutputSpec.metric``) to
these functions; a new metric (e.g. a head-specific one) is one more function registered
there, plus the tolerance field its gate reads in ``gate_threshold``. ``sample_scores``
turns the values into a ``SampleScores`` (worst, mean, worst index).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from trtpack.sources.recipe import Tolerance

TOP1_METRICS = ("top1", "token_top1", "span")
"""Metrics gated by ``min_top1`` (argmax agreement)."""


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


def scaled_error_per_sample(ref: np.ndarray, out: np.ndarray,
                            inputs: Mapping[str, np.ndarray], mask_input: str | None
                            ) -> np.ndarray:
    """The gate of a generic output (a detector's boxes in pixels, a probability map, a
    recurrent state): for each sample, 1 - its largest absolute difference divided by its
    scale, the reference sample's largest absolute value but at least 1. A probability is
    judged by its absolute error, a box coordinate in pixels by its error against the image
    size, and an all-near-zero map (where a cosine means nothing) by how far it moved."""
    if not _per_sample(ref):
        a = ref.astype(np.float64).reshape(1, -1)
        b = out.astype(np.float64).reshape(1, -1)
    else:
        a = ref.astype(np.float64).reshape(ref.shape[0], -1)
        b = out.astype(np.float64).reshape(out.shape[0], -1)
    if a.shape[1] == 0:
        return np.ones(a.shape[0])
    scale = np.maximum(np.abs(a).max(axis=1), 1.0)
    error = np.abs(a - b).max(axis=1) / scale
    return np.where(np.isfinite(error), 1.0 - error, -np.inf)


# token_top1 is the argmax at every unpadded token (LMs, token classification), which
# top1_per_sample computes per sample
SAMPLE_METRICS: dict[str, SampleMetric] = {
    "pooled_cosine": pooled_cosine_per_sample,
    "cosine": cosine_per_sample,
    "top1": top1_per_sample,
    "token_top1": top1_per_sample,
    "span": span_per_sample,
    "scaled_error": scaled_error_per_sample,
    "data_dependent": scaled_error_per_sample,  # where the shapes agree (compare_cases)
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
    if metric in ("scaled_error", "data_dependent") and tol.max_scaled_error is not None:
        return 1.0 - tol.max_scaled_error
    return None


def metric_label(metric: str) -> str:
    """What a sample's value of ``metric`` is called in a report line."""
    if metric in TOP1_METRICS:
        return "top-1 agreement"
    if metric in ("scaled_error", "data_dependent"):
        return "1 - scaled max error"
    return "cosine"


def task_metric(metric: str, ref: np.ndarray, out: np.ndarray,
                inputs: Mapping[str, np.ndarray], mask_input: str | None) -> float | None:
    """The task metric of one output: its worst sample's value."""
    scores = sample_scores(metric, ref, out, inputs, mask_input)
    return None if scores is None else scores.worst
