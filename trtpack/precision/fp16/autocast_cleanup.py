"""ModelOpt AutoCast's dead-node cleanup, with an index instead of a scan per tensor.

After converting, AutoCast drops the nodes (mostly Casts it added) whose outputs nothing reads:
``PrecisionConverter._cleanup_no_consumer_nodes`` asks, for every output of every node, which
nodes read it, and each question scans every node of the graph. That is quadratic in the
nodes (bert-large's time: benchmarks/README.md, "Figures behind design choices"). Here the
names every node reads are gathered once; the nodes removed are the same (a test compares the
two on a graph with dead nodes). The patch is scoped to one conversion and applies to the
pinned ModelOpt only (the method it replaces is private); otherwise nothing changes.

Runs in the ModelOpt worker; onnx and ModelOpt are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

MODELOPT_VERSION = "0.47.0"  # the version whose private cleanup method is replaced


def unconsumed_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes of ``graph`` (not its subgraphs) none of whose outputs is a graph output or
    read by a node of ``graph``: what AutoCast's cleanup removes."""
    outputs = {o.name for o in graph.output}
    read = {name for node in graph.node for name in node.input}
    return [node for node in graph.node
            if not any(out in outputs or out in read for out in node.output)]


def modelopt_is_pinned() -> bool:
    try:
        return importlib.metadata.version("nvidia-modelopt") == MODELOPT_VERSION
    except importlib.metadata.PackageNotFoundError:
        return False


@contextlib.contextmanager
def indexed_autocast_cleanup() -> Iterator[bool]:
    """Within the block, AutoCast removes its dead nodes with ``unconsumed_nodes``; yields
    whether the patch applies (pinned ModelOpt only)."""
    if not modelopt_is_pinned():
        yield False
        return
    from modelopt.onnx.autocast.precisionconverter import PrecisionConverter

    original = PrecisionConverter._cleanup_no_consumer_nodes

    def cleanup(self: Any) -> None:
        for node in unconsumed_nodes(self.model.graph):
            self.model.graph.node.remove(node)

    PrecisionConverter._cleanup_no_consumer_nodes = cleanup  # type: ignore[method-assign]
    try:
        yield True
    finally:
        PrecisionConverter._cleanup_no_consumer_nodes = original  # type: ignore[method-assign]
