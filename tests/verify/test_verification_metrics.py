"""Every recipe metric but 'none' is gated: the cosine ones by min_cosine, the argmax ones
(verification.TOP1_METRICS, shared with the INT8 search) by min_top1."""

from __future__ import annotations

from typing import get_args

import numpy as np

from trtpack.sources.recipe import Metric
from trtpack.verify.sample_metrics import TOP1_METRICS, task_metric


def test_top1_metrics_and_cosine_metrics_cover_every_metric() -> None:
    assert set(TOP1_METRICS) | {"cosine", "pooled_cosine", "none"} == set(get_args(Metric))


def test_top1_metrics_measure_argmax_agreement() -> None:
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(4, 6)).astype(np.float32)
    flipped = ref.copy()
    flipped[0] = -flipped[0]  # the first sample's argmax moves
    for metric in TOP1_METRICS:
        assert task_metric(metric, ref, ref, {}, None) == 1.0
        value = task_metric(metric, ref, flipped, {}, None)
        assert value is not None and value < 1.0, metric
