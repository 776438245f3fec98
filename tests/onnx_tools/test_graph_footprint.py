"""An ONNX graph's footprint at one input shape: weights from its initializers, activations
by ``resources.activation_bytes`` over the shapes inferred at that input shape."""

from __future__ import annotations

from pathlib import Path

from trtpack.onnx_tools.footprint import graph_footprint, load_graph
from trtpack.testing.models import conv_onnx


def test_conv_footprint_is_counted_from_the_graph(tmp_path: Path) -> None:
    graph = load_graph(conv_onnx(tmp_path / "conv.onnx", channels=(16, 32)))
    found = graph_footprint(graph, {"image": (8, 3, 224, 224)})
    assert found.weights == 4 * (16 * 3 * 9 + 32 * 16 * 9)
    plane = 224 * 224 * 4
    # the second Conv: its input (16 channels) and output (32 channels) alive together
    assert found.activations == 8 * plane * (16 + 32)
    assert found.unsized == 0


def test_activations_follow_the_corner(tmp_path: Path) -> None:
    graph = load_graph(conv_onnx(tmp_path / "conv.onnx"))
    small = graph_footprint(graph, {"image": (1, 3, 32, 32)})
    large = graph_footprint(graph, {"image": (4, 3, 64, 64)})
    assert large.activations == 16 * small.activations  # 4x the batch, 4x the pixels
    assert large.weights == small.weights
