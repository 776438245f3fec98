"""Every recipe metric but 'none' is gated: the cosine ones by min_cosine, the argmax ones
(verification.TOP1_METRICS, shared with the INT8 search) by min_top1, the generic outputs'
scaled error (and the data-dependent outputs', where shapes agree) by max_scaled_error."""

from __future__ import annotations

from typing import get_args

import numpy as np
import pytest

from trtpack.sources.recipe import DEFAULT_TOLERANCES, Metric
from trtpack.verify.sample_metrics import TOP1_METRICS, gate_threshold, task_metric

SCALED = ("scaled_error", "data_dependent")


def test_top1_metrics_and_cosine_metrics_cover_every_metric() -> None:
    assert set(TOP1_METRICS) | {"cosine", "pooled_cosine", "none", *SCALED} \
        == set(get_args(Metric))
    for metric in set(get_args(Metric)) - {"none"}:
        assert all(gate_threshold(metric, tol) is not None
                   for tol in DEFAULT_TOLERANCES.values()), metric


def test_scaled_error_judges_each_sample_against_its_scale() -> None:
    """A probability map near zero (where a cosine is 0 when FP16 flushes it) passes on its
    absolute error; boxes in pixels are judged against their size; the worst sample rules."""
    near_zero = np.full((2, 16), 1e-9, np.float32)
    flushed = np.zeros_like(near_zero)
    assert task_metric("scaled_error", near_zero, flushed, {}, None) > 0.999
    boxes = np.array([[10.0, 20.0, 630.0, 400.0], [5.0, 5.0, 50.0, 60.0]], np.float32)
    moved = boxes + np.array([[3.0, 0, 0, 0], [0, 0, 0, 6.0]], np.float32)
    scores = task_metric("scaled_error", boxes, moved, {}, None)
    assert scores is not None and abs(scores - (1 - 6.0 / 60.0)) < 1e-6  # the second box
    probabilities = np.array([[0.2, 0.9]], np.float32)
    assert task_metric("scaled_error", probabilities, probabilities + 0.05, {}, None) \
        == pytest.approx(0.95)


def test_top1_metrics_measure_argmax_agreement() -> None:
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(4, 6)).astype(np.float32)
    flipped = ref.copy()
    flipped[0] = -flipped[0]  # the first sample's argmax moves
    for metric in TOP1_METRICS:
        assert task_metric(metric, ref, ref, {}, None) == 1.0
        value = task_metric(metric, ref, flipped, {}, None)
        assert value is not None and value < 1.0, metric
