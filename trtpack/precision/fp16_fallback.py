"""FP16 when ModelOpt AutoCast cannot convert a graph: onnxconverter-common's
``convert_float_to_float16`` with FP32 inputs and outputs (``keep_io_types``) and a block
list grown while it runs: the converted model is run in ONNX Runtime on the reference feed,
and a node ONNX Runtime fails on is kept in FP32 and the conversion redone, never a list
written for a particular model. Runs in the worker process (a crash there is the worker's,
not the build's); the stage verifies the result per sample like every variant.

onnx, onnxruntime and onnxconverter-common are imported inside the functions.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from trtpack.onnx_tools.files import save_model
from trtpack.precision.modelopt_jobs import ModelOptJob

MAX_BLOCKED_BY_FAILURE = 16
"""Nodes the fallback keeps in FP32 because ONNX Runtime failed on them, at most."""

_NODE_NAME = re.compile(r"Name:\s*'([^']*)'|[Nn]ode \(([^)]*)\)")


def run_problem(model: Any, feed: dict[str, Any]) -> str | None:
    """Why ONNX Runtime cannot run ``model`` (a path or a ModelProto) on ``feed``: its error
    message, or None when it runs and its outputs are finite."""
    import numpy as np

    from trtpack.runtimes.onnxruntime import cpu_session

    try:
        session = cpu_session(model, few_runs=True)
        inputs = {i.name for i in session.get_inputs()}
        outputs = session.run(None, {k: v for k, v in feed.items() if k in inputs})
    except Exception as e:  # ONNX Runtime's own errors (kernels, shapes, buffers)
        return " ".join(str(e).split()) or type(e).__name__
    if not all(np.isfinite(np.asarray(o, dtype=np.float64)).all() for o in outputs
               if np.issubdtype(np.asarray(o).dtype, np.floating)):
        return "non-finite outputs"
    return None


def failing_node(message: str, containers: dict[str, str]) -> str | None:
    """The top-level node to keep in FP32 for an ONNX Runtime error: the innermost node the
    error names (``Name:'...'``, ``node (...)``; inside an ``If`` or ``Loop`` body ONNX
    Runtime names it with an inlined prefix), or the control-flow node that holds it: a body
    is kept in FP32 whole, as the converters cannot type a body half converted.
    ``containers``: every node name (subgraphs included) -> its top-level node's name."""
    for match in reversed(_NODE_NAME.findall(message)):
        found = match[0] or match[1]
        if found in containers:
            return containers[found]
        inner = [n for n in containers if n and found.endswith(n)]
        if inner:
            return containers[max(inner, key=len)]
    return None


def top_level_containers(graph: Any) -> dict[str, str]:
    """Every node's name in ``graph`` and in its subgraphs -> the name of the node of
    ``graph`` it is (or lies inside)."""
    found: dict[str, str] = {}

    def inside(sub: Any, top: str) -> None:
        for node in sub.node:
            found.setdefault(node.name, top)
            for attribute in node.attribute:
                for body in ([attribute.g] if attribute.HasField("g") else []) + \
                        list(attribute.graphs):
                    inside(body, top)

    for node in graph.node:
        found[node.name] = node.name
        for attribute in node.attribute:
            for body in ([attribute.g] if attribute.HasField("g") else []) + \
                    list(attribute.graphs):
                inside(body, node.name)
    return found


def outer_constants(graph: Any, container: str) -> list[str]:
    """The top-level Constant nodes whose values the bodies of node ``container`` read: a
    body kept in FP32 needs them in FP32 too."""
    read: set[str] = set()

    def collect(sub: Any) -> None:
        for node in sub.node:
            read.update(node.input)
            for attribute in node.attribute:
                for body in ([attribute.g] if attribute.HasField("g") else []) + \
                        list(attribute.graphs):
                    collect(body)

    for node in graph.node:
        if node.name == container:
            for attribute in node.attribute:
                for body in ([attribute.g] if attribute.HasField("g") else []) + \
                        list(attribute.graphs):
                    collect(body)
    return [n.name for n in graph.node if n.op_type == "Constant" and set(n.output) & read]


def convert_float16(job: ModelOptJob, work: Path) -> dict[str, Any]:
    """onnxconverter-common's FP16 conversion of ``job.input``, its block list grown from what
    ONNX Runtime fails on; the result says which nodes were blocked and why."""
    import numpy as np
    import onnx
    from onnxconverter_common import float16

    spec = job.fp16
    assert spec is not None
    feed: dict[str, Any] = {}
    if spec.reference_inputs:
        with np.load(spec.reference_inputs) as data:
            feed = {k: data[k] for k in data.files}
    source = onnx.load(job.input, load_external_data=True)
    containers = top_level_containers(source.graph)
    blocked: dict[str, str] = {}
    while True:
        converted = float16.convert_float_to_float16(
            onnx.ModelProto.FromString(source.SerializeToString()),
            keep_io_types=spec.keep_io_types,
            node_block_list=[*spec.nodes_to_exclude, *blocked],
            op_block_list=[*float16.DEFAULT_OP_BLOCK_LIST, *spec.op_types_to_exclude],
            check_fp16_ready=False)
        problem = run_problem(converted, feed) if feed else None
        if problem is None:
            break
        node = failing_node(problem, containers)
        kept = {*blocked, *spec.nodes_to_exclude}
        new = [node] if node is not None and node not in kept else \
            [c for c in outer_constants(source.graph, node) if c not in kept] if node else []
        if not new or len(blocked) >= MAX_BLOCKED_BY_FAILURE:
            raise RuntimeError(f"onnxconverter-common's FP16 model does not run in ONNX "
                               f"Runtime ({len(blocked)} nodes kept in FP32 so far): {problem}")
        for name in new:
            blocked[name] = problem[:200] if name == node else \
                f"a value the FP32 body of '{node}' reads"
    save_model(converted, Path(job.output))
    return {"converter": "float16", "blocked_by_failure": blocked}
