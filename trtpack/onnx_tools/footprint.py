"""An ONNX model's footprint at one input shape: its weights, and its activations
(``resources.activation_bytes``) from the graph with every tensor's shape inferred at that
input shape. Core module: onnx is imported inside the functions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.resources import Op, activation_bytes

if TYPE_CHECKING:
    import onnx

Shape = Sequence[int]


@dataclass(frozen=True)
class Footprint:
    """What one run of a model at one input shape holds: weights and activations, in bytes;
    ``unsized`` counts the intermediate tensors whose size could not be inferred (0 bytes
    each in the activations: the figure is then a lower bound)."""

    weights: int
    activations: int
    unsized: int = 0


def initializer_bytes(model: onnx.ModelProto) -> int:
    """The bytes of a model's weights (its initializers, inline or external: read from their
    dims, nothing loaded)."""
    from trtpack.onnx_tools.files import tensor_bytes

    return sum(tensor_bytes(t) for t in model.graph.initializer)


def _elem_bytes(elem_type: int) -> int:
    import numpy as np
    from onnx import helper

    try:
        return int(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize)
    except (KeyError, TypeError, ValueError):
        return 4


def _with_shapes(model: onnx.ModelProto, shapes: Mapping[str, Shape]) -> onnx.ModelProto:
    """A copy of the graph (no weights) with its inputs fixed to ``shapes`` and every value's
    shape inferred (ONNX's inference, propagating shape computations)."""
    import onnx

    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    initializers = {t.name for t in fixed.graph.initializer}
    for value in fixed.graph.input:
        if value.name in initializers or value.name not in shapes:
            continue
        dims = value.type.tensor_type.shape.dim
        for dim, size in zip(dims, shapes[value.name], strict=False):
            dim.Clear()
            dim.dim_value = int(size)
    del fixed.graph.value_info[:]
    try:
        return onnx.shape_inference.infer_shapes(fixed, data_prop=True)
    except Exception:  # an op ONNX cannot infer: the shapes it did infer are lost too
        return fixed


def load_graph(path: Path) -> onnx.ModelProto:
    """The model's graph without its weights' data (their dims are kept)."""
    import onnx

    return onnx.load(str(path), load_external_data=False)


def graph_footprint(model: onnx.ModelProto, shapes: Mapping[str, Shape]) -> Footprint:
    """``model``'s weights and activations when its inputs have ``shapes`` (name -> dims)."""
    inferred = _with_shapes(model, shapes)
    graph = inferred.graph
    sizes: dict[str, int] = {}
    for value in [*graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        if not tensor.HasField("shape"):
            continue
        count = 1
        for dim in tensor.shape.dim:  # no dims: a scalar
            if not dim.HasField("dim_value"):
                break
            count *= dim.dim_value
        else:
            sizes[value.name] = count * _elem_bytes(tensor.elem_type)
    ops = [Op(tuple(i for i in node.input if i), tuple(o for o in node.output if o))
           for node in graph.node]
    written = {key for op in ops for key in op.writes}
    unsized = len(written - sizes.keys())
    return Footprint(initializer_bytes(model),
                     activation_bytes(ops, sizes, [o.name for o in graph.output]), unsized)
