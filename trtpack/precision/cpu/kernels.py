"""Choosing ONNX Runtime's faster CPU kernels where a fused operator is slower than its parts.

ONNX Runtime's CPU ``SkipLayerNormalization`` is about twice as slow as ``Add`` +
``LayerNormalization`` on the same tensors (``benchmarks/cpu_kernels.py``), and ONNX
Runtime fuses an ``Add`` that feeds a ``LayerNormalization`` back into it when it loads the
model. The residual sum is therefore written as ``Sum``, which its fusion does not match: the
served graph runs ``LayerNormalization``'s kernel whatever the session's optimization level.
The arithmetic is the same (a bias add, a residual add, a layer norm), so the outputs match
the fused graph's to float rounding; the stage checks them per sample like every variant.

In the INT8 form, ``BiasGelu`` after a quantized MatMul is written as ``Add`` + ``Gelu``:
ONNX Runtime then folds the bias into its ``DynamicQuantizeMatMul`` and runs the plain
``Gelu`` kernel, faster than ``BiasGelu`` on large tensors (it fuses ``BiasGelu`` back where
the MatMul stays FP32)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

SKIP_LAYER_NORM = "SkipLayerNormalization"
MS_DOMAIN = "com.microsoft"
LAYER_NORM_OPSET = 17  # LayerNormalization in the default domain


def split_skip_layer_norms(model: onnx.ModelProto) -> int:
    """Replace each ``SkipLayerNormalization(x, skip, gamma, beta[, bias])`` of ``model`` by
    ``Add(x, bias)`` → ``Sum(·, skip)`` → ``LayerNormalization(gamma, beta)``, in place;
    returns how many were replaced. A node whose mean or inverse standard deviation output
    is read is left fused (``LayerNormalization`` does not give the same values), as is every
    node of a model whose opset predates ``LayerNormalization``."""
    from onnx import helper

    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < LAYER_NORM_OPSET:
        return 0
    read = {name for node in graph.node for name in node.input}
    read |= {o.name for o in graph.output}
    replaced = 0
    index = -1
    while index + 1 < len(graph.node):
        index += 1
        node = graph.node[index]
        if node.op_type != SKIP_LAYER_NORM:
            continue
        outputs = list(node.output) + [""] * (4 - len(node.output))
        if any(name and name in read for name in outputs[1:3]):
            continue
        epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-12)
        x, skip, gamma = node.input[0], node.input[1], node.input[2]
        beta = node.input[3] if len(node.input) > 3 else ""
        bias = node.input[4] if len(node.input) > 4 else ""
        parts = []
        if bias:
            parts.append(helper.make_node("Add", [x, bias], [f"{node.name}_biased"],
                                          name=f"{node.name}_bias"))
            x = f"{node.name}_biased"
        total = outputs[3] or f"{node.name}_sum"
        parts.append(helper.make_node("Sum", [x, skip], [total], name=f"{node.name}_residual"))
        parts.append(helper.make_node(
            "LayerNormalization", [total, gamma, *([beta] if beta else [])], [outputs[0]],
            name=f"{node.name}_layer_norm", axis=-1, epsilon=epsilon))
        index = replace_node(graph, index, parts)
        replaced += 1
    return replaced


def replace_node(graph: onnx.GraphProto, index: int, parts: list[onnx.NodeProto]) -> int:
    """Put ``parts`` where ``graph.node[index]`` was (the order stays topological); returns
    the index of the last part."""
    del graph.node[index]
    for offset, part in enumerate(parts):
        graph.node.insert(index + offset, part)
    return index + len(parts) - 1


def split_bias_gelus(model: onnx.ModelProto) -> int:
    """Replace each ``BiasGelu(x, bias)`` of ``model`` by ``Add(x, bias)`` → ``Gelu``, in
    place; returns how many were replaced."""
    from onnx import helper

    graph = model.graph
    replaced = 0
    index = -1
    while index + 1 < len(graph.node):
        index += 1
        node = graph.node[index]
        if node.op_type != "BiasGelu" or node.domain != MS_DOMAIN:
            continue
        biased = f"{node.name}_biased"
        parts = [helper.make_node("Add", [node.input[0], node.input[1]], [biased],
                                  name=f"{node.name}_bias"),
                 helper.make_node("Gelu", [biased], [node.output[0]], name=f"{node.name}_gelu",
                                  domain=MS_DOMAIN)]
        index = replace_node(graph, index, parts)
        replaced += 1
    return replaced
