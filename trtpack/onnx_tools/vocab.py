"""How many token ids a graph takes: the rows of the embedding table its token-ids input
indexes, read from the graph without its weights (onnx is imported inside the function)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

TABLE_PASSTHROUGH = ("Cast", "Identity", "Mul", "DequantizeLinear")


def vocab_from_graph(path: Path, token_input: str) -> int | None:
    """The rows of the embedding table the token ids index, or None: a Gather of the ids
    (maybe after a Cast) on an initializer, or on one dequantized on the way (Cast/Mul,
    DequantizeLinear of an int8 table, as weight-only and dynamic quantizers write)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    sizes = {t.name: list(t.dims) for t in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output}
    names = {token_input}
    for node in model.graph.node:
        if node.op_type in ("Cast", "Identity") and node.input and node.input[0] in names:
            names.update(node.output)
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in names:
            rows = table_rows(node.input[0], sizes, producers)
            if rows is not None:
                return rows
    return None


def table_rows(name: str, sizes: dict[str, list[int]], producers: dict[str, onnx.NodeProto],
               depth: int = 4) -> int | None:
    """The first dimension of the 2-D table ``name`` is, followed back through
    ``TABLE_PASSTHROUGH`` ops to an initializer (a scale of shape [rows, 1] or [1] is not the
    table: only a 2-D initializer with more than one column counts)."""
    dims = sizes.get(name)
    if dims is not None:
        return int(dims[0]) if len(dims) == 2 and dims[0] > 1 and dims[1] > 1 else None
    node = producers.get(name)
    if node is None or depth == 0 or node.op_type not in TABLE_PASSTHROUGH:
        return None
    operands = node.input[:1] if node.op_type == "DequantizeLinear" else node.input
    for operand in operands:
        rows = table_rows(operand, sizes, producers, depth - 1)
        if rows is not None:
            return rows
    return None
