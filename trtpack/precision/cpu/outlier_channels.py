"""Outlier channels of a transformer's feed-forward block kept in FP32 for the CPU INT8 form.

BERT-like models carry a few huge activations (the "massive activations": one token, one
channel, 10-100x every other value) into the feed-forward block's GELU output. ONNX
Runtime's dynamic quantization scales that whole tensor by one range, so the outlier makes
the step of every other value coarse: on all-MiniLM-L6-v2, the second MatMul of layers 0-3
alone cost 0.2-0.9 % of the worst sentence's cosine each (``benchmarks/cpu_int8_everything``).

Feed-forward ``MatMul(W1) → BiasGelu(b1) → MatMul(W2)`` equals the same block over the
other channels plus the block over the outlier channels, because GELU acts per channel:
``W1[:, c]``, ``b1[c]`` and ``W2[c, :]`` move to a small FP32 branch whose result is added
to the big one, and the big one, INT8 on integer kernels, no longer sees the outliers. The
channels are those whose calibration maximum is ``ratio`` times the one after the
``max_channels`` largest: a handful, or none where no channel stands out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from trtpack.precision.cpu.kernels import MS_DOMAIN

if TYPE_CHECKING:
    import onnx

OUTLIER_RATIO = 3.0
MAX_OUTLIER_CHANNELS = 8
SUFFIX = "_outlier_channels"


@dataclass(frozen=True)
class OutlierSplit:
    """One feed-forward block whose outlier channels moved to an FP32 branch."""

    matmul: str  # the block's second MatMul (its INT8 part keeps this name)
    channels: list[int]
    fp32_nodes: list[str]  # the branch's MatMuls: keep them out of the quantization


def feed_forward_blocks(model: onnx.ModelProto
                        ) -> list[tuple[onnx.NodeProto, onnx.NodeProto, onnx.NodeProto]]:
    """(first MatMul, BiasGelu, second MatMul) of each feed-forward block of a fused graph
    whose weights and bias are constants and whose intermediates have one reader each."""
    inits = {i.name for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    blocks = []
    for second in model.graph.node:
        if second.op_type != "MatMul" or second.input[1] not in inits:
            continue
        gelu = producer.get(second.input[0])
        if gelu is None or gelu.op_type != "BiasGelu" or gelu.input[1] not in inits:
            continue
        first = producer.get(gelu.input[0])
        if first is None or first.op_type != "MatMul" or first.input[1] not in inits:
            continue
        if readers.get(gelu.output[0]) == 1 and readers.get(first.output[0]) == 1:
            blocks.append((first, gelu, second))
    return blocks


def _residual_sum(readers: Mapping[str, list[onnx.NodeProto]], output: str
                  ) -> onnx.NodeProto | None:
    """The ``Sum`` that adds ``output``, through its one bias ``Add``, to the residual
    (``trtpack.precision.cpu.kernels``' form of a split SkipLayerNormalization), or None."""
    bias = readers.get(output, [])
    if len(bias) != 1 or bias[0].op_type != "Add":
        return None
    total = readers.get(bias[0].output[0], [])
    return total[0] if len(total) == 1 and total[0].op_type == "Sum" else None


def outlier_channels(maxima: np.ndarray, ratio: float = OUTLIER_RATIO,
                     max_channels: int = MAX_OUTLIER_CHANNELS) -> list[int]:
    """The channels whose maximum is ``ratio`` times the ``max_channels + 1``-th largest."""
    if maxima.size <= max_channels:
        return []
    reference = float(np.sort(maxima)[::-1][max_channels])
    if reference <= 0:
        return []
    return sorted(int(c) for c in np.flatnonzero(maxima >= ratio * reference))


def split_outlier_channels(model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]],
                           ratio: float = OUTLIER_RATIO,
                           max_channels: int = MAX_OUTLIER_CHANNELS) -> list[OutlierSplit]:
    """Move each feed-forward block's outlier channels (measured on ``feeds``, the
    calibration inputs) to an FP32 branch, in place; returns what moved."""
    from onnx import helper, numpy_helper

    from trtpack.precision.smoothquant import channel_maxima

    blocks = feed_forward_blocks(model)
    if not blocks or not feeds:
        return []
    maxima = channel_maxima(model, [gelu.output[0] for _, gelu, _ in blocks], feeds)
    inits = {i.name: i for i in model.graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    narrowed: set[str] = set()
    splits = []
    for first, gelu, second in blocks:
        channels = outlier_channels(maxima[gelu.output[0]], ratio, max_channels)
        if not channels:
            continue
        w1, b1, w2 = (numpy_helper.to_array(inits[n])
                      for n in (first.input[1], gelu.input[1], second.input[1]))
        keep = np.setdiff1d(np.arange(w1.shape[1]), channels)
        name = f"{second.name}{SUFFIX}"
        for init, value in ((inits[first.input[1]], w1[:, keep]), (inits[gelu.input[1]], b1[keep]),
                            (inits[second.input[1]], w2[keep, :])):
            init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(value), init.name))
        # one channel: an outer product, where a broadcast Mul beats a K=1 MatMul
        down_op, w2_part = ("Mul", w2[channels[0], :]) if len(channels) == 1 \
            else ("MatMul", w2[channels, :])
        model.graph.initializer.extend([
            numpy_helper.from_array(np.ascontiguousarray(w1[:, channels]), f"{name}.w1"),
            numpy_helper.from_array(np.ascontiguousarray(b1[channels]), f"{name}.b1"),
            numpy_helper.from_array(np.ascontiguousarray(w2_part), f"{name}.w2")])
        branch = [
            helper.make_node("MatMul", [first.input[0], f"{name}.w1"], [f"{name}.up"],
                             name=f"{name}_up"),
            helper.make_node("BiasGelu", [f"{name}.up", f"{name}.b1"], [f"{name}.gelu"],
                             name=f"{name}_gelu", domain=MS_DOMAIN),
            helper.make_node(down_op, [f"{name}.gelu", f"{name}.w2"], [f"{name}.down"],
                             name=f"{name}_down")]
        residual = _residual_sum(readers, second.output[0])
        if residual is not None:  # one more term of the residual Sum: no extra pass
            residual.input.append(f"{name}.down")
            position = list(model.graph.node).index(residual)
        else:
            branch.append(helper.make_node("Add", [f"{name}.main", f"{name}.down"],
                                           [second.output[0]], name=f"{name}_add"))
            second.output[0] = f"{name}.main"
            position = list(model.graph.node).index(second) + 1
        for offset, node in enumerate(branch):
            model.graph.node.insert(position + offset, node)
        narrowed.update((first.output[0], gelu.output[0]))
        splits.append(OutlierSplit(second.name, channels, [f"{name}_up", f"{name}_down"]))
    # the narrowed intermediates' recorded shapes are stale
    for info in [v for v in model.graph.value_info if v.name in narrowed]:
        model.graph.value_info.remove(info)
    return splits
