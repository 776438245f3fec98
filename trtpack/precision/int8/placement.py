"""Where trtpack's own INT8 Q/DQ goes (``trtpack.precision.int8.qdq``): ModelOpt 0.47's rules
for MatMul/Gemm/Conv with the op types given, on the graph alone.

Every MatMul/Gemm/Conv node that is not excluded (by name or op type), less the GEMV and
small-GEMM MatMul/Gemm nodes (``find_nodes_from_matmul_to_exclude``: an output dimension of
1, or N or K below 16, on the first calibration batch), the attention MatMuls of a sequence
longer than 512 (``find_nodes_from_mha_to_exclude``) and the Conv nodes TensorRT has no INT8
kernel for (``find_nodes_from_convs_to_exclude``); a Softmax output's range set to [0, 1]
(``FIXED_RANGE_OP_TYPES``). Its preprocessing (``prepare_graph``): the
opset raised to 19, shared initializers duplicated.
onnx is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import onnx

MIN_MATMUL_DIM = 16  # ModelOpt 0.47 graph_utils._MIN_MATMUL_DIM: N or K below it stays FP32
MAX_MHA_SEQUENCE = 512  # ModelOpt 0.47: INT8 attention MatMuls only up to this sequence
MHA_WILDCARDS = frozenset({"Div", "Mul", "Add", "Reshape", "Transpose", "Flatten", "Cast"})
FIXED_RANGE_OP_TYPES = {"Softmax": 1.0}
"""Op types whose output's range is set, not measured: ModelOpt 0.47 (``ort_patching.
_adjust_tensor_ranges``), like ONNX Runtime's ``adjust_tensor_ranges``, gives a Softmax
output the range [0, 1] (scale 1/127). Measured instead, the range of nearly uniform
attention (bert-large's random weights) is a fraction of that, and a sample that attends
more sharply than every calibration sample (a short one) is clipped."""


@dataclass
class Placement:
    """The candidate nodes of a graph and what the calibration run must measure for them."""

    nodes: list[onnx.NodeProto]
    activations: list[str]  # tensors read by candidates that get an activation Q/DQ
    shaped: list[str]  # tensors whose first-batch shape the MatMul rules need
    attention: list[tuple[str, str, str]]  # (BMM1, its second input, BMM2) of each MHA
    fixed: dict[str, float] = field(default_factory=dict)  # activation -> absmax by rule


class RangeHistogram(Protocol):
    """A tensor's histogram that gives a range (``activation_ranges.ActivationHistogram``)."""

    def mse_amax(self) -> float: ...


@dataclass
class Calibration:
    """What the calibration run measured: each activation's largest absolute value over
    every batch, and the shapes of the first batch; for ``mse`` calibration, a histogram of
    each measured activation (not of those whose range is fixed by rule)."""

    absmax: dict[str, float] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    batches: int = 0
    histograms: dict[str, RangeHistogram] = field(default_factory=dict)

    def ranges(self, method: str) -> dict[str, float]:
        """Each measured activation's range for ``method``: its absmax (``max``), or with
        ``mse`` its least-squared-error range where it has a histogram."""
        if method != "mse":
            return dict(self.absmax)
        return {t: self.histograms[t].mse_amax() if t in self.histograms else a
                for t, a in self.absmax.items()}

    def add(self, absmax: Mapping[str, float], shapes: Mapping[str, tuple[int, ...]]) -> None:
        for name, value in absmax.items():
            self.absmax[name] = max(self.absmax.get(name, 0.0), value)
        if not self.batches:
            self.shapes.update(shapes)
        self.batches += 1


def weight_inputs(node: onnx.NodeProto) -> list[tuple[int, int]]:
    """(input index, channel axis) of the inputs ONNX Runtime quantizes per channel when
    they are initializers."""
    if node.op_type == "Conv":
        return [(1, 0)]
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return [(1, 0 if trans_b else 1)]
    return [(0, 1), (1, 1)]  # MatMul


def quantized_inputs(node: onnx.NodeProto) -> list[int]:
    """The inputs of ``node`` that get Q/DQ (a bias never does: ``QuantizeBias`` off)."""
    return [0, 1] if len(node.input) >= 2 else [0]


def _conv_supported(node: onnx.NodeProto, weight: onnx.TensorProto | None,
                    graph_inputs: set[str]) -> bool:
    """ModelOpt's INT8 rule for a Conv (``find_nodes_from_convs_to_exclude``)."""
    if weight is None or not 3 <= len(weight.dims) <= 5:
        return False
    out_channels, in_channels = weight.dims[0], weight.dims[1]
    if out_channels >= 16 and in_channels >= 16:
        return True
    attrs = {a.name: a for a in node.attribute}
    group = attrs["group"].i if "group" in attrs else 1
    kernel = list(attrs["kernel_shape"].ints) if "kernel_shape" in attrs else [1, 1]
    if group == 1 and (out_channels % 8 == 0 or in_channels % 8 == 0) \
            and any(t in graph_inputs for t in node.input) and len(set(kernel)) == 1:
        return True
    return group > 1 and out_channels % 8 == 0 and all(k >= 3 for k in kernel)


def attention_pairs(graph: onnx.GraphProto) -> list[tuple[str, str, str]]:
    """(BMM1, its second input, BMM2) of each MatMul -> ... -> Softmax -> ... -> MatMul chain
    (only ``MHA_WILDCARDS`` between), as ModelOpt's ``find_mha_partitions`` matches them."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for t in node.input:
            consumers.setdefault(t, []).append(node)

    def reach(node: onnx.NodeProto, target: str) -> onnx.NodeProto | None:
        current = node
        for _ in range(16):
            nexts = [c for out in current.output for c in consumers.get(out, [])]
            hit = next((c for c in nexts if c.op_type == target), None)
            if hit is not None:
                return hit
            passing = [c for c in nexts if c.op_type in MHA_WILDCARDS]
            if len(passing) != 1:
                return None
            current = passing[0]
        return None

    found = []
    for node in graph.node:
        if node.op_type == "MatMul" and len(node.input) == 2:
            softmax = reach(node, "Softmax")
            bmm2 = reach(softmax, "MatMul") if softmax is not None else None
            if bmm2 is not None:
                found.append((node.name, node.input[1], bmm2.name))
    return found


def place(graph: onnx.GraphProto, op_types: Iterable[str], excluded: Iterable[str],
          excluded_op_types: Iterable[str]) -> Placement:
    """The candidates before the shape rules (``excluded``: exact node names)."""
    from onnx import TensorProto

    wanted = set(op_types) - set(excluded_op_types)
    skip = set(excluded)
    inits = {i.name: i for i in graph.initializer}
    graph_inputs = {i.name for i in graph.input}
    nodes = []
    for node in graph.node:
        if node.op_type not in wanted or node.name in skip or len(node.input) < 2:
            continue
        if node.op_type == "Conv" and not _conv_supported(node, inits.get(node.input[1]),
                                                          graph_inputs):
            continue
        weights = dict(weight_inputs(node))
        if any(i in weights and node.input[i] in inits
               and inits[node.input[i]].data_type != TensorProto.FLOAT
               for i in quantized_inputs(node)):
            continue
        nodes.append(node)
    activations: list[str] = []
    shaped: list[str] = []
    for node in nodes:
        for i in quantized_inputs(node):
            t = node.input[i]
            if t not in inits and t not in activations:
                activations.append(t)
        if node.op_type in ("MatMul", "Gemm"):
            shaped.append(node.output[0])
            if node.input[1] not in inits:
                shaped.append(node.input[1])
    names = {n.name for n in nodes}
    attention = [a for a in attention_pairs(graph) if a[0] in names or a[2] in names]
    shaped += [b for _, b, _ in attention if b not in shaped]
    return Placement(nodes, activations, shaped, attention, fixed_ranges(graph, activations))


def fixed_ranges(graph: onnx.GraphProto, activations: Iterable[str]) -> dict[str, float]:
    """The absmax of each of ``activations`` whose range is set by its producer's op type
    (``FIXED_RANGE_OP_TYPES``), not measured."""
    produced = {out: node.op_type for node in graph.node for out in node.output}
    return {t: FIXED_RANGE_OP_TYPES[produced[t]] for t in activations
            if produced.get(t) in FIXED_RANGE_OP_TYPES}


def shape_exclusions(placement: Placement, calibration: Calibration,
                     inits: Mapping[str, onnx.TensorProto]) -> list[str]:
    """The MatMul/Gemm candidates ModelOpt excludes on the first batch's shapes (GEMV, small
    GEMM, attention over more than 512 tokens), and the non-float activations ONNX Runtime
    does not quantize."""
    shapes = calibration.shapes
    excluded: list[str] = []
    for node in placement.nodes:
        if any(node.input[i] not in inits and node.input[i] not in calibration.absmax
               for i in quantized_inputs(node)):
            excluded.append(node.name)  # not a float tensor: ONNX Runtime leaves it
            continue
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        out = shapes.get(node.output[0])
        if out is None:
            continue
        all_activations = all(t not in inits for t in node.input)
        if all_activations:
            if len(out) < 2 or out[-1] == 1 or out[-2] == 1:
                excluded.append(node.name)
                continue
        elif len(out) < 3 and any(d == 1 for d in out):
            excluded.append(node.name)
            continue
        n_dim = out[-1] if len(out) >= 2 else 0
        trans_b = node.op_type == "Gemm" and any(a.name == "transB" and a.i
                                                 for a in node.attribute)
        b = node.input[1]
        b_shape = tuple(inits[b].dims) if b in inits else shapes.get(b)
        k_dim = b_shape[-1 if trans_b else -2] if b_shape is not None and len(b_shape) >= 2 \
            else None
        if 0 < n_dim < MIN_MATMUL_DIM or (k_dim is not None and 0 < k_dim < MIN_MATMUL_DIM):
            excluded.append(node.name)
    for bmm1, second, bmm2 in placement.attention:
        seq = shapes.get(second)
        if seq is not None and len(seq) and seq[-1] > MAX_MHA_SEQUENCE:
            excluded += [bmm1, bmm2]
    return excluded


INT8_OPSET = 19
"""The opset ModelOpt's INT8 path raises a model to (Q/DQ with FP16 scales)."""


def prepare_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """ModelOpt's preprocessing that changes the graph, on the graph alone: the opset raised
    to ``INT8_OPSET``, and each initializer read by several node inputs duplicated, one copy
    per use, named as ModelOpt names them (``<name>_1``, ``<name>_2`` ...; TensorRT wants a
    quantized weight read by its DequantizeLinear only)."""
    import onnx

    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if 1 < version < INT8_OPSET:
        model = onnx.version_converter.convert_version(model, INT8_OPSET)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    uses: dict[str, int] = dict.fromkeys(inits, 0)
    used_names = set(inits) | {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
    for node in graph.node:
        used_names.update(t for t in (*node.input, *node.output) if t)
        for t in node.input:
            if t in uses:
                uses[t] += 1
    shared = {name for name, count in uses.items() if count > 1}
    suffixes: dict[str, int] = {}
    for node in graph.node:
        for k, t in enumerate(node.input):
            if t not in shared:
                continue
            suffix = suffixes.get(t, 1)
            while f"{t}_{suffix}" in used_names:
                suffix += 1
            suffixes[t] = suffix + 1
            copy = graph.initializer.add()
            copy.CopyFrom(inits[t])
            copy.name = f"{t}_{suffix}"
            used_names.add(copy.name)
            node.input[k] = copy.name
    kept = [i for i in graph.initializer if i.name not in shared
            or i.name in {o.name for o in graph.output}]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    graph_inputs = [i for i in graph.input if i.name not in shared]
    del graph.input[:]
    graph.input.extend(graph_inputs)
    return model
