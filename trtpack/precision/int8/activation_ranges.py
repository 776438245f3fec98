"""Percentile calibration of a Q/DQ model's activation ranges.

ModelOpt's ONNX INT8 path calibrates activations with ``max`` or ``entropy`` only. With
``percentile``, trtpack takes ModelOpt's ``max`` model and sets the scale of every
activation QuantizeLinear/DequantizeLinear pair to the given percentile of the tensor's
absolute values over the calibration batches (symmetric INT8: scale = range / 127), so a
few outlier values (BERT's LayerNorm outputs have some) no longer stretch the range that
every ordinary value is rounded on. The FP32 model is run once with those tensors marked
as outputs. onnx and onnxruntime are imported inside the function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

DEFAULT_PERCENTILE = 99.99
INT8_MAX = 127.0


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
    from trtpack.runtimes.onnxruntime import cpu_session, with_outputs

    session = cpu_session(with_outputs(fp32, tensors))
    inputs = {i.name for i in session.get_inputs()}
    values: dict[str, list[np.ndarray]] = {t: [] for t in tensors}
    for feed in feeds:
        outs = session.run(list(tensors), {k: v for k, v in feed.items() if k in inputs})
        for name, value in zip(tensors, outs, strict=True):
            values[name].append(np.abs(np.asarray(value, dtype=np.float32)).ravel())
    return {t: float(np.percentile(np.concatenate(v), percentile)) for t, v in values.items()}


def apply_percentile_ranges(quantized: onnx.ModelProto, fp32: onnx.ModelProto,
                            feeds: Sequence[Mapping[str, np.ndarray]],
                            percentile: float = DEFAULT_PERCENTILE) -> int:
    """Rescale the activation Q/DQ of ``quantized`` in place (their scale initializers);
    returns how many tensors were rescaled. Only symmetric scalar scales (zero point 0)
    are changed."""
    from onnx import numpy_helper

    quantizers = activation_quantizers(quantized)
    ranges = percentile_ranges(fp32, sorted(quantizers), feeds, percentile)
    inits = {i.name: i for i in quantized.graph.initializer}
    dequantizers: dict[str, list[onnx.NodeProto]] = {}
    for node in quantized.graph.node:
        if node.op_type == "DequantizeLinear":
            dequantizers.setdefault(node.input[0], []).append(node)
    changed = 0
    for tensor, nodes in quantizers.items():
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
