"""Percentile and MSE calibration of a Q/DQ model's activation ranges.

ModelOpt's ONNX INT8 path calibrates activations with ``max`` or ``entropy`` only. With
``percentile``, trtpack takes ModelOpt's ``max`` model and sets the scale of every
activation QuantizeLinear/DequantizeLinear pair to the given percentile of the tensor's
absolute values over the calibration batches (symmetric INT8: scale = range / 127), so a
few outlier values (BERT's LayerNorm outputs have some) no longer stretch the range that
every ordinary value is rounded on. The FP32 model is run once with those tensors marked
as outputs.

With ``mse``, each range is the one of least squared quantization error over a histogram of
the tensor's absolute values (``ActivationHistogram``, ``mse_amax``), NVIDIA's histogram
calibrator's ``mse`` method (pytorch-quantization ``calib/histogram.py`` and ModelOpt's
torch ``HistogramCalibrator``, ``_compute_amax_mse``): 2048 bins over the first batch's
range, grown at the same width when a later batch goes further; each bin center from bin
128 upward is a candidate range, the bin centers are fake-quantized with it (round half to
even, clamped to 127 steps) and the count-weighted squared error is summed; the candidate
with the least error wins. trtpack adds the measured absmax itself as a last candidate, so
the chosen range is never worse than ``max`` by that measure. The histograms are filled one
calibration batch at a time (``trtpack.precision.int8.qdq.CalibrationRun``, in the
references' run; ``mse_ranges`` for a ModelOpt model): only one batch's activations are
held. onnx and onnxruntime are imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

DEFAULT_PERCENTILE = 99.99
INT8_MAX = 127.0
HISTOGRAM_BINS = 2048  # NVIDIA's HistogramCalibrator num_bins
MSE_START_BIN = 128  # _compute_amax_mse start_bin: no range below 1/16 of the first batch's
MSE_CANDIDATES_AT_ONCE = 256  # candidate ranges evaluated together (memory: 256 x bins)


class ActivationHistogram:
    """Counts of a tensor's absolute values in bins of one width from 0, the width set by
    the first batch with a nonzero value (its largest / ``HISTOGRAM_BINS``); a later batch
    that goes further adds bins of the same width (NVIDIA's ``HistogramCalibrator.collect``),
    so a batch's values are counted, never kept. ``absmax``: the largest absolute value."""

    def __init__(self, bins: int = HISTOGRAM_BINS) -> None:
        self.bins = bins
        self.width = 0.0
        self.counts = np.zeros(0, dtype=np.int64)
        self.absmax = 0.0

    def add(self, values: np.ndarray) -> None:
        """Count ``values`` (any shape; a float copy of |values| is made one tensor at a
        time)."""
        magnitudes = np.abs(np.asarray(values, dtype=np.float32)).ravel()  # a copy
        if not magnitudes.size:
            return
        top = float(magnitudes.max())
        self.absmax = max(self.absmax, top)
        if top == 0.0 and self.width == 0.0:
            self.counts = np.zeros(1, dtype=np.int64)  # zeros so far: counted in bin 0
            self.counts[0] += magnitudes.size
            return
        if self.width == 0.0:
            self.width = top / self.bins
            zeros = int(self.counts.sum())
            self.counts = np.zeros(self.bins, dtype=np.int64)
            self.counts[0] = zeros
        needed = max(len(self.counts), int(np.ceil(top / self.width)))
        # in place, then one integer copy: ~15 ns a value on a loaded 2-core machine
        np.divide(magnitudes, np.float32(self.width), out=magnitudes)
        np.minimum(magnitudes, np.float32(needed - 1), out=magnitudes)  # top: the last bin
        counts = np.bincount(magnitudes.astype(np.intp), minlength=needed)
        del magnitudes
        counts[:len(self.counts)] += self.counts
        self.counts = counts

    def mse_amax(self, start_bin: int = MSE_START_BIN) -> float:
        """The range of least squared quantization error (``mse_amax``)."""
        return mse_amax(self.counts, self.width, self.absmax, start_bin)


def quantization_error(values: np.ndarray, amax: float, weights: np.ndarray | None = None
                       ) -> float:
    """The (``weights``-weighted) sum of squared errors of ``values`` fake-quantized to
    symmetric INT8 on [-amax, amax] (round half to even, as QuantizeLinear)."""
    x = np.asarray(values, dtype=np.float64)
    scale = amax / INT8_MAX
    error = (np.clip(np.round(x / scale), -INT8_MAX, INT8_MAX) * scale - x) ** 2
    return float(error.sum() if weights is None else (error * weights).sum())


def mse_amax(counts: np.ndarray, width: float, absmax: float,
             start_bin: int = MSE_START_BIN) -> float:
    """The range, among the bin centers from ``start_bin`` on and ``absmax``, whose
    fake-quantization of the bin centers has the least count-weighted squared error
    (NVIDIA's ``_compute_amax_mse``); ``absmax`` when the histogram is empty or all zero."""
    if width <= 0.0 or absmax <= 0.0 or not counts.any():
        return absmax
    centers = (np.arange(len(counts), dtype=np.float64) + 0.5) * width
    weights = counts.astype(np.float64)
    candidates = centers[min(start_bin, len(centers) - 1):]
    candidates = np.append(candidates[candidates < absmax], absmax)
    errors = np.empty(len(candidates))
    for at in range(0, len(candidates), MSE_CANDIDATES_AT_ONCE):
        amax = candidates[at:at + MSE_CANDIDATES_AT_ONCE, None]
        scale = amax / INT8_MAX
        fake = np.minimum(np.round(centers[None, :] / scale), INT8_MAX) * scale
        errors[at:at + len(amax)] = ((fake - centers[None, :]) ** 2 * weights).sum(axis=1)
    return float(candidates[int(np.argmin(errors))])


def activation_quantizers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """{activation tensor: QuantizeLinear nodes reading it} (not the weights')."""
    inits = {i.name for i in model.graph.initializer}
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] not in inits \
                and len(node.input) > 1 and node.input[1] in inits:
            found.setdefault(node.input[0], []).append(node)
    return found


def percentile_ranges(fp32: onnx.ModelProto, tensors: Sequence[str],
                      feeds: Sequence[Mapping[str, np.ndarray]], percentile: float
                      ) -> dict[str, float]:
    """The ``percentile`` of |x| of each tensor over ``feeds``, in the FP32 model."""
    values: dict[str, list[np.ndarray]] = {t: [] for t in tensors}
    for outs in activations(fp32, tensors, feeds):
        for name, value in zip(tensors, outs, strict=True):
            values[name].append(np.abs(np.asarray(value, dtype=np.float32)).ravel())
    return {t: float(np.percentile(np.concatenate(v), percentile)) for t, v in values.items()}


def activations(fp32: onnx.ModelProto, tensors: Sequence[str],
                feeds: Iterable[Mapping[str, np.ndarray]]) -> Iterator[list[np.ndarray]]:
    """The values of ``tensors`` (in their order) for each of ``feeds``, one feed at a time,
    from one ONNX Runtime session of the FP32 model with those tensors as outputs."""
    from trtpack.runtimes.onnxruntime import cpu_session, with_outputs

    session = cpu_session(with_outputs(fp32, tensors))
    inputs = {i.name for i in session.get_inputs()}
    for feed in feeds:
        yield session.run(list(tensors), {k: v for k, v in feed.items() if k in inputs})


def mse_ranges(fp32: onnx.ModelProto, tensors: Sequence[str],
               feeds: Iterable[Mapping[str, np.ndarray]]) -> dict[str, float]:
    """The least-squared-error range of each tensor over ``feeds`` (``mse_amax``), in the
    FP32 model: one feed's activations at a time, counted into histograms."""
    histograms = {t: ActivationHistogram() for t in tensors}
    for outs in activations(fp32, tensors, feeds):
        for name in tensors:
            histograms[name].add(outs.pop(0))
        del outs
    return {t: h.mse_amax() for t, h in histograms.items()}


def apply_percentile_ranges(quantized: onnx.ModelProto, fp32: onnx.ModelProto,
                            feeds: Sequence[Mapping[str, np.ndarray]],
                            percentile: float = DEFAULT_PERCENTILE) -> int:
    """Rescale the activation Q/DQ of ``quantized`` in place (their scale initializers);
    returns how many tensors were rescaled. Only symmetric scalar scales (zero point 0)
    are changed."""
    quantizers = activation_quantizers(quantized)
    return set_activation_ranges(quantized,
                                 percentile_ranges(fp32, sorted(quantizers), feeds, percentile))


def apply_mse_ranges(quantized: onnx.ModelProto, fp32: onnx.ModelProto,
                     feeds: Iterable[Mapping[str, np.ndarray]]) -> int:
    """Set the activation Q/DQ of ``quantized`` (in place) to their ``mse_ranges``, but for
    the ranges set by rule (a Softmax output's [0, 1], ``placement.fixed_ranges``); returns
    how many tensors were rescaled (symmetric scalar scales only)."""
    from trtpack.precision.int8.placement import fixed_ranges

    quantizers = activation_quantizers(quantized)
    fixed = fixed_ranges(fp32.graph, quantizers)
    measured = sorted(t for t in quantizers if t not in fixed)
    return set_activation_ranges(quantized, mse_ranges(fp32, measured, feeds))


def rescale_model(quantized: Path, fp32: Path, feeds: Sequence[Mapping[str, np.ndarray]],
                  method: str) -> int:
    """The max Q/DQ model at ``quantized`` rewritten with its activation ranges set by
    ``method`` (``percentile``: ``DEFAULT_PERCENTILE``; ``mse``) on the FP32 model at
    ``fp32``; returns how many were set."""
    import onnx

    from trtpack.onnx_tools.files import save_model

    model = onnx.load(str(quantized))
    source = onnx.load(str(fp32))
    if method == "mse":
        changed = apply_mse_ranges(model, source, feeds)
    else:
        changed = apply_percentile_ranges(model, source, feeds, DEFAULT_PERCENTILE)
    save_model(model, quantized)
    return changed


def set_activation_ranges(quantized: onnx.ModelProto, ranges: Mapping[str, float]) -> int:
    """Set the scale of each activation Q/DQ pair of ``quantized`` whose tensor ``ranges``
    names to range / 127 (in place); returns how many tensors were rescaled. Only symmetric
    scalar scales (zero point 0) are changed."""
    from onnx import numpy_helper

    quantizers = activation_quantizers(quantized)
    inits = {i.name: i for i in quantized.graph.initializer}
    dequantizers: dict[str, list[onnx.NodeProto]] = {}
    for node in quantized.graph.node:
        if node.op_type == "DequantizeLinear":
            dequantizers.setdefault(node.input[0], []).append(node)
    changed = 0
    for tensor, nodes in quantizers.items():
        if tensor not in ranges:
            continue
        for node in nodes:
            scale = numpy_helper.to_array(inits[node.input[1]])
            zero = inits.get(node.input[2]) if len(node.input) > 2 else None
            if scale.size != 1 or (zero is not None and numpy_helper.to_array(zero).any()):
                continue
            new = max(ranges[tensor], 1e-8) / INT8_MAX
            # the pair's scale: the QuantizeLinear's and that of each DequantizeLinear
            # reading it (usually one shared initializer)
            names = {node.input[1], *(dq.input[1] for dq in dequantizers.get(node.output[0], []))}
            for name in names:
                init = inits[name]
                old = numpy_helper.to_array(init)
                init.CopyFrom(numpy_helper.from_array(
                    np.asarray(new, dtype=old.dtype).reshape(old.shape), name))
            changed += 1
    return changed
