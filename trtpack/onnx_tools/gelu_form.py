"""The exact GELU written in the order ONNX Runtime's ``GeluFusion`` recognizes.

The dynamo exporter writes ``gelu(x)`` as ``x * (0.5 * (1 + erf(x / sqrt 2)))``. ONNX
Runtime fuses an erf GELU into its ``Gelu`` kernel only when written ``(x * (1 + erf(x /
sqrt 2))) * 0.5`` or ``(0.5 * x) * (1 + erf(x / sqrt 2))`` (``gelu_fusion.cc``), so every ONNX
Runtime session over the exported graph (verify, calibration, the checks) ran GELU as five
passes over each feed-forward activation. ``rewire_erf_gelus`` moves the ``* 0.5`` last:
the same five nodes, two of them with their inputs exchanged. The value is the same bit for
bit wherever the graph runs as written: multiplying by 0.5 is exact in binary floating point
(short of a subnormal or overflowing product), so ``x * (0.5 * a)`` and ``(x * a) * 0.5``
round once, to the same number. What changes is that ONNX Runtime's optimizer can now fuse
it (its ``Gelu`` kernel rounds differently in the last bits); onnxruntime.transformers' own
fusion (the CPU model's) matches either order.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

_SQRT2_TOLERANCE = 1e-3  # ONNX Runtime's fusion takes a divisor within this of sqrt(2)


def _scalar_constants(model: onnx.ModelProto) -> dict[str, float]:
    """{tensor: value} of each one-element float initializer or ``Constant`` output."""
    import numpy as np
    from onnx import numpy_helper

    found: dict[str, float] = {}
    tensors = [(t.name, t) for t in model.graph.initializer]
    tensors += [(n.output[0], a.t) for n in model.graph.node
                if n.op_type == "Constant" and n.domain in ("", "ai.onnx")
                for a in n.attribute if a.name == "value"]
    for name, tensor in tensors:
        if math.prod(tensor.dims) != 1 or tensor.data_location != 0:
            continue
        value = numpy_helper.to_array(tensor)
        if np.issubdtype(value.dtype, np.floating):
            found[name] = float(value.reshape(()))
    return found


def rewire_erf_gelus(model: onnx.ModelProto) -> int:
    """Rewrite, in place, each ``Mul(x, Mul(0.5, Add(Erf(Div(x, sqrt 2)), 1)))`` of ``model``'s
    main graph (either operand order of each node) as ``Mul(Mul(x, Add(...)), 0.5)``: the
    inner ``Mul`` now reads ``x`` and the ``Add``, the outer one the inner's output and 0.5.
    Nodes, names, tensor names and metadata stay; the outer node still writes the GELU's
    output. Only where every intermediate tensor has that one reader and is no graph output.
    Returns how many were rewritten."""
    constants = _scalar_constants(model)
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output if o}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    outputs = {o.name for o in graph.output}

    def private(tensor: str) -> bool:  # read once, by the pattern's next node
        return readers.get(tensor) == 1 and tensor not in outputs

    def other(node: onnx.NodeProto, tensor: str) -> str | None:
        """The input of two-input ``node`` that is not ``tensor`` (None: not such a node)."""
        if len(node.input) != 2 or tensor not in node.input:
            return None
        first, second = node.input
        return second if first == tensor else first if second == tensor else None

    def is_op(node: onnx.NodeProto | None, op: str) -> bool:
        return node is not None and node.op_type == op and node.domain in ("", "ai.onnx")

    rewired = 0
    for outer in graph.node:
        if not is_op(outer, "Mul") or len(outer.input) != 2:
            continue
        for x, half_out in (tuple(outer.input), tuple(reversed(outer.input))):
            half = producer.get(half_out)
            if not is_op(half, "Mul") or not private(half_out):
                continue
            assert half is not None
            ones_out = next((i for i in half.input if constants.get(other(half, i) or "") == 0.5
                             and is_op(producer.get(i), "Add")), None)
            if ones_out is None or not private(ones_out):
                continue
            ones = producer[ones_out]
            erf_out = next((i for i in ones.input if constants.get(other(ones, i) or "") == 1.0
                            and is_op(producer.get(i), "Erf")), None)
            if erf_out is None or not private(erf_out):
                continue
            div_out = producer[erf_out].input[0]
            div = producer.get(div_out)
            if (not is_op(div, "Div") or not private(div_out) or div is None
                    or list(div.input[:1]) != [x]
                    or abs(constants.get(div.input[1], 0.0) - math.sqrt(2)) > _SQRT2_TOLERANCE):
                continue
            half_constant = other(half, ones_out)
            assert half_constant is not None
            half.input[:] = [x, ones_out]
            outer.input[:] = [half_out, half_constant]
            rewired += 1
            break
    return rewired
