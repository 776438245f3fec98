"""Reading and editing a converted model's graph: which MatMul/Gemm/Conv nodes compute in
low precision (INT8: both operands from DequantizeLinear; FP16: a float16 first operand),
Q/DQ wiring, element types, empty model shells, readable node hints.

onnx is imported inside the functions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    import onnx


COMPUTE_OP_TYPES = ("MatMul", "Gemm", "Conv")

# Ops that carry a dequantized tensor to a MatMul input unchanged in value (K^T, casts).
PASS_THROUGH = {"Cast", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Identity"}

# Ops that only move or select values: FP16 cannot add error in them.
DATA_MOVEMENT = PASS_THROUGH | {"Shape", "Constant", "Concat", "Slice", "Expand", "Flatten",
                                  "Where", "Range"}


def producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def _from_dequantize(tensor: str, produced_by: Mapping[str, onnx.NodeProto]) -> bool:
    seen = 0
    node = produced_by.get(tensor)
    while node is not None and node.op_type in PASS_THROUGH and seen < 8:
        node = produced_by.get(node.input[0])
        seen += 1
    return node is not None and node.op_type == "DequantizeLinear"


def int8_quantized_nodes(model: onnx.ModelProto) -> set[str]:
    """MatMul/Gemm/Conv nodes whose two operands both come from DequantizeLinear."""
    produced_by = producers(model)
    return {
        n.name for n in model.graph.node
        if n.op_type in COMPUTE_OP_TYPES and len(n.input) >= 2
        and all(_from_dequantize(t, produced_by) for t in n.input[:2])
    }


def dedicate_qdq(model: onnx.ModelProto, op_types: Sequence[str]) -> list[str]:
    """Keep Q/DQ only where a quantized node reads it; returns the nodes rewired.

    ONNX Runtime's quantizer (which ModelOpt drives) puts one Q/DQ pair on a tensor and
    makes *every* consumer read the dequantized copy: a residual Add reading the same
    LayerNorm output as a quantized MatMul gets quantized too, and so does a MatMul that was
    excluded. Consumers that are not quantized nodes are wired back to the original tensor
    (edits ``model`` in place; Q/DQ nodes left unused are removed).
    """
    quantized = int8_quantized_nodes(model)
    produced_by = producers(model)
    kept_types = set(op_types) | PASS_THROUGH | {"QuantizeLinear", "DequantizeLinear"}
    rewired: list[str] = []
    for node in model.graph.node:
        if node.name in quantized:
            continue
        if node.op_type in kept_types and node.op_type not in COMPUTE_OP_TYPES:
            continue
        for i, tensor in enumerate(node.input):
            dq = produced_by.get(tensor)
            if dq is None or dq.op_type != "DequantizeLinear":
                continue
            q = produced_by.get(dq.input[0])
            if q is None or q.op_type != "QuantizeLinear":
                continue
            node.input[i] = q.input[0]
            if not rewired or rewired[-1] != node.name:
                rewired.append(node.name)
    if rewired:
        outputs = {o.name for o in model.graph.output}
        nodes = prune(list(model.graph.node), outputs)
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        used = {t for n in nodes for t in n.input}
        unused = [i for i in model.graph.initializer if i.name not in used]
        for init in unused:
            model.graph.initializer.remove(init)
    return rewired


def prune(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """Drop nodes none of whose outputs is used (Q/DQ left behind by a rewired node)."""
    while True:
        used = {t for n in nodes for t in n.input} | outputs
        kept = [n for n in nodes if any(o in used for o in n.output)]
        if len(kept) == len(nodes):
            return kept
        nodes = kept


def fp16_nodes(model: onnx.ModelProto) -> set[str]:
    """MatMul/Gemm/Conv nodes, control-flow bodies included, that compute in float16 (their
    first operand is float16)."""
    import onnx

    types = tensor_types(model)
    return {n.name for n in nodes_with_subgraphs(model.graph) if n.op_type in COMPUTE_OP_TYPES
            and types.get(n.input[0]) == onnx.TensorProto.FLOAT16}


def tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor ONNX shape inference can type (weights not needed)."""
    import onnx

    light = model_shell(model)
    g = light.graph
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    g.value_info.extend(model.graph.value_info)
    for init in model.graph.initializer:  # metadata only: inference needs no values
        g.initializer.append(onnx.TensorProto(name=init.name, data_type=init.data_type,
                                              dims=init.dims))
    # best effort: where inference fails, the Cast and initializer types below remain
    with contextlib.suppress(Exception):
        light = onnx.shape_inference.infer_shapes(light, strict_mode=False)
    types: dict[str, int] = {}
    bodies = [light.graph, *(g for n in nodes_with_subgraphs(light.graph)
                             for a in n.attribute
                             for g in ([a.g] if a.HasField("g") else []) + list(a.graphs))]
    for vi in (v for g in bodies for v in [*g.input, *g.value_info, *g.output]):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for init in model.graph.initializer:
        types[init.name] = init.data_type
    for node in nodes_with_subgraphs(model.graph):
        if node.op_type == "Cast":
            to = next((a.i for a in node.attribute if a.name == "to"), None)
            if to is not None:
                types[node.output[0]] = to
    return types


def model_shell(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of a model's metadata and opsets with an empty graph (name kept)."""
    import onnx

    shell = onnx.ModelProto(
        ir_version=model.ir_version, producer_name=model.producer_name,
        producer_version=model.producer_version, domain=model.domain,
        model_version=model.model_version, doc_string=model.doc_string)
    shell.opset_import.extend(model.opset_import)
    shell.metadata_props.extend(model.metadata_props)
    shell.functions.extend(model.functions)
    shell.graph.name = model.graph.name
    return shell


class LowPrecisionCounts(TypedDict):
    """``LowPrecisionStats`` as report.json's ``low_precision`` holds it."""

    compute_nodes: int
    low_precision_nodes: int
    share: float
    matmul_gemm_nodes: int
    matmul_gemm_low_precision: int
    matmul_gemm_share: float
    by_op_type: dict[str, list[int]]


@dataclass
class LowPrecisionStats:
    """How much of a model's MatMul/Gemm/Conv work runs in the low precision."""

    total: int
    low: int
    matmul_gemm_total: int
    matmul_gemm_low: int
    by_op_type: dict[str, list[int]] = field(default_factory=dict)  # op -> [low, total]

    @property
    def share(self) -> float:
        return self.low / self.total if self.total else 0.0

    @property
    def matmul_gemm_share(self) -> float:
        return self.matmul_gemm_low / self.matmul_gemm_total if self.matmul_gemm_total else 0.0

    def as_dict(self) -> LowPrecisionCounts:
        return {
            "compute_nodes": self.total, "low_precision_nodes": self.low,
            "share": round(self.share, 4),
            "matmul_gemm_nodes": self.matmul_gemm_total,
            "matmul_gemm_low_precision": self.matmul_gemm_low,
            "matmul_gemm_share": round(self.matmul_gemm_share, 4),
            "by_op_type": self.by_op_type,
        }


def low_precision_stats(model: onnx.ModelProto, precision: str) -> LowPrecisionStats:
    """MatMul and Gemm are counted together: onnxsim fuses MatMul+Add into Gemm."""
    low_names = int8_quantized_nodes(model) if precision == "int8" else fp16_nodes(model)
    by_op: dict[str, list[int]] = {}
    for n in nodes_with_subgraphs(model.graph):  # a body's nodes count, as FP32 when unsure
        if n.op_type in COMPUTE_OP_TYPES:
            entry = by_op.setdefault(n.op_type, [0, 0])
            entry[0] += n.name in low_names
            entry[1] += 1
    mm = [by_op.get(op, [0, 0]) for op in ("MatMul", "Gemm")]
    return LowPrecisionStats(
        total=sum(v[1] for v in by_op.values()), low=sum(v[0] for v in by_op.values()),
        matmul_gemm_total=sum(v[1] for v in mm), matmul_gemm_low=sum(v[0] for v in mm),
        by_op_type=by_op,
    )


def nodes_with_subgraphs(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes of ``graph`` and of the bodies of its ``If``/``Loop``/``Scan`` nodes."""
    nodes = []
    for node in graph.node:
        nodes.append(node)
        for attribute in node.attribute:
            if attribute.HasField("g"):
                nodes.extend(nodes_with_subgraphs(attribute.g))
            for sub in attribute.graphs:
                nodes.extend(nodes_with_subgraphs(sub))
    return nodes


def node_hint(node: onnx.NodeProto, initializer_names: set[str]) -> str:
    """A human name for a node: its weight's name (e.g. encoder.layer.3.output.dense)."""
    for name in node.input[1:]:
        if name in initializer_names and "." in name and not name.startswith(("onnx::", "val_")):
            for suffix in (".weight", ".bias"):
                name = name.removesuffix(suffix)
            return name
    return node.name


def absmax_types() -> frozenset[int]:
    """The ONNX element types a tensor's largest absolute value is taken of (numbers and
    booleans, cast to FP32 for it)."""
    from onnx import TensorProto as T

    return frozenset({T.FLOAT, T.FLOAT16, T.BFLOAT16, T.DOUBLE, T.BOOL, T.INT8, T.INT16,
                      T.INT32, T.INT64, T.UINT8, T.UINT16, T.UINT32, T.UINT64})


def absmax_outputs(model: onnx.ModelProto, tensors: list[str]) -> dict[str, str]:
    """Make ``model`` (an ``onnx.ModelProto``, changed in place) output, instead of its own
    outputs, the largest absolute value of each of ``tensors`` as an FP32 scalar: Cast, Abs,
    flattened with a 0 appended (an empty tensor gives 0), ReduceMax, placed right after the
    node that makes the tensor (a graph input's: first), so that a one-run session
    (priority-based order) frees each tensor there: in ONNX Runtime's default order every
    tensor lived to the end of the run. Returns tensor name -> output name."""
    from onnx import TensorProto, helper

    graph = model.graph
    flat, zero = "trtpack_absmax/flat_shape", "trtpack_absmax/zero"
    graph.initializer.extend([helper.make_tensor(flat, TensorProto.INT64, [1], [-1]),
                              helper.make_tensor(zero, TensorProto.FLOAT, [1], [0.0])])
    wanted = set(tensors)
    outputs: dict[str, str] = {}

    def reduce(name: str) -> list[onnx.NodeProto]:
        if name not in wanted or name in outputs:
            return []
        p = f"trtpack_absmax/{len(outputs)}/"
        outputs[name] = p + "max"
        return [
            helper.make_node("Cast", [name], [p + "cast"], to=TensorProto.FLOAT,
                             name=p + "Cast"),
            helper.make_node("Abs", [p + "cast"], [p + "abs"], name=p + "Abs"),
            helper.make_node("Reshape", [p + "abs", flat], [p + "flat"], name=p + "Reshape"),
            helper.make_node("Concat", [p + "flat", zero], [p + "padded"], axis=0,
                             name=p + "Concat"),
            helper.make_node("ReduceMax", [p + "padded"], [p + "max"], keepdims=0,
                             name=p + "ReduceMax"),
        ]

    nodes = [n for i in graph.input for n in reduce(i.name)]
    for node in graph.node:
        nodes.append(node)
        for name in node.output:
            nodes += reduce(name)
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.output[:]
    graph.output.extend(helper.make_tensor_value_info(o, TensorProto.FLOAT, [])
                        for o in outputs.values())
    return outputs
