"""FP16 when ModelOpt AutoCast cannot convert a graph: onnxconverter-common's
``convert_float_to_float16`` with FP32 inputs and outputs (``keep_io_types``) and a block
list grown while it runs: the converted model is run in ONNX Runtime on the reference feed,
and a node ONNX Runtime fails on is kept in FP32 and the conversion redone, never a list
written for a particular model. The converter cannot type a control-flow body half
converted inside its graph, so each ``If`` body is converted as a graph of its own with FP32
boundaries (lifted into a standalone model, converted and checked the same way, nested bodies
recursively, and put back); a body it cannot check stays FP32, with the reason. Runs in the
worker process (a crash there is the worker's,
not the build's); the stage verifies the result per sample like every variant.

onnx, onnxruntime and onnxconverter-common are imported inside the functions.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.onnx_tools.files import save_model
from trtpack.precision.fp16.runtime_check import CRASHED, crash_suspect, run_problem
from trtpack.precision.modelopt_jobs import Fp16Job, ModelOptJob, WorkerResult

if TYPE_CHECKING:
    import numpy as np
    import onnx

MAX_BLOCKED_BY_FAILURE = 16
"""Nodes the fallback keeps in FP32 because ONNX Runtime failed on them, at most."""

_NODE_NAME = re.compile(r"Name:\s*'([^']*)'|[Nn]ode \(([^)]*)\)")


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


def top_level_containers(graph: onnx.GraphProto) -> dict[str, str]:
    """Every node's name in ``graph`` and in its subgraphs -> the name of the node of
    ``graph`` it is (or lies inside)."""
    found: dict[str, str] = {}

    def inside(sub: onnx.GraphProto, top: str) -> None:
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


def convert_float16(job: ModelOptJob, work: Path) -> WorkerResult:
    """onnxconverter-common's FP16 conversion of ``job.input``, its block list grown from what
    ONNX Runtime fails on, each control-flow body converted as a graph of its own; the result
    says which nodes were blocked and why, and which bodies stayed FP32 and why."""
    import numpy as np
    import onnx

    spec = job.fp16
    assert spec is not None
    feed: dict[str, np.ndarray] = {}
    if spec.reference_inputs:
        with np.load(spec.reference_inputs) as data:
            feed = {k: data[k] for k in data.files}
    source = onnx.load(job.input, load_external_data=True)
    blocked: dict[str, str] = {}
    kept: dict[str, str] = {}
    converted = convert_graph(source, feed, spec, blocked, kept, spec.keep_io_types)
    save_model(converted, Path(job.output))
    return {"converter": "float16", "blocked_by_failure": blocked, "kept_fp32": kept}


def subgraphs(node: onnx.NodeProto) -> list[tuple[str, onnx.GraphProto]]:
    """(attribute name, body) of each graph a node holds (If, Loop, Scan)."""
    return [(a.name, g) for a in node.attribute
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def convert_graph(source: onnx.ModelProto, feed: dict[str, np.ndarray], spec: Fp16Job,
                  blocked: dict[str, str], kept: dict[str, str], keep_io_types: bool
                  ) -> onnx.ModelProto:
    """``source`` in FP16 with its control-flow nodes' bodies converted on their own (FP32
    at their boundaries: the values they read from this graph are cast to FP32 for them;
    the converters cannot type a body half converted inside its graph), checked to run on
    ``feed`` at each level; ``blocked`` and ``kept`` gain the nodes and bodies (node/attribute)
    left in FP32, with the reason."""
    from onnx import TensorProto
    from onnxconverter_common import float16

    containers = top_level_containers(source.graph)
    control = [n.name for n in source.graph.node if subgraphs(n)]
    floats = {v.name for v in outer_inputs(source, [r for n in source.graph.node
                                                     for _, g in subgraphs(n)
                                                     for r in outer_reads(g)])
              if v.type.tensor_type.elem_type == TensorProto.FLOAT} if control else set()
    while True:
        converted = float16.convert_float_to_float16(
            source.__class__.FromString(source.SerializeToString()),
            keep_io_types=keep_io_types,
            node_block_list=[*spec.nodes_to_exclude, *control, *blocked],
            op_block_list=[*float16.DEFAULT_OP_BLOCK_LIST, *spec.op_types_to_exclude],
            check_fp16_ready=False)
        if keep_io_types:
            float_outputs(converted.graph, source.graph)
        trial = converted.__class__.FromString(converted.SerializeToString())
        cast_outer_reads(trial.graph, control, floats)
        problem = run_problem(trial, feed) if feed else None
        if problem is None:
            break
        node = failing_node(problem, containers)
        done = {*blocked, *spec.nodes_to_exclude, *control}
        if node is None and problem.startswith(CRASHED):
            node = crash_suspect(source.graph, done)
        if node is None or node in done or len(blocked) >= MAX_BLOCKED_BY_FAILURE:
            raise RuntimeError(f"onnxconverter-common's FP16 model does not run in ONNX "
                               f"Runtime ({len(blocked)} nodes kept in FP32 so far): {problem}")
        blocked[node] = problem[:200]
    before = dict(kept)
    for name in control:
        convert_bodies(source, converted, name, feed, spec, blocked, kept)
    cast_outer_reads(converted.graph, control, floats)
    problem = run_problem(converted, feed) if feed and control else None
    if problem is not None:  # the bodies converted alone do not run together: all FP32
        kept.clear()
        kept.update(before)
        kept.update((f"{name}/*", f"its bodies converted alone do not run in it: "
                                  f"{problem[:200]}") for name in control)
        converted = trial
    nodes = in_order(list(converted.graph.node))
    converted.graph.ClearField("node")
    converted.graph.node.extend(nodes)
    return converted


def in_order(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """``nodes`` sorted so that each comes after the nodes making the values it and its
    bodies read (the converter appends the Casts it inserts; ONNX wants bodies sorted)."""
    made_by = {v: k for k, n in enumerate(nodes) for v in n.output if v}
    ordered: list[onnx.NodeProto] = []
    placed: set[int] = set()

    def place(k: int) -> None:
        if k in placed:
            return
        placed.add(k)
        node = nodes[k]
        for name in [*node.input, *(r for _, g in subgraphs(node) for r in outer_reads(g))]:
            if name in made_by:
                place(made_by[name])
        ordered.append(node)

    for k in range(len(nodes)):
        place(k)
    return ordered


def float_outputs(graph: onnx.GraphProto, original: onnx.GraphProto) -> None:
    """A Cast to FP16 that makes an output of ``original`` (not FP16 there) casts to FP32:
    the converter casts a kept node's output that is also the graph's output to FP16, against
    keep_io_types (its Casts to FP16 are of float values only)."""
    from onnx import TensorProto

    outputs = {o.name for o in original.output
               if o.type.tensor_type.elem_type != TensorProto.FLOAT16}
    for node in graph.node:
        if node.op_type == "Cast" and node.output[0] in outputs:
            for attribute in node.attribute:
                if attribute.name == "to" and attribute.i == TensorProto.FLOAT16:
                    attribute.i = TensorProto.FLOAT
    stale = [v for v in graph.value_info if v.name in outputs]
    for v in stale:
        graph.value_info.remove(v)
    for output in graph.output:
        if output.name in outputs and output.type.tensor_type.elem_type == TensorProto.FLOAT16:
            output.type.tensor_type.elem_type = TensorProto.FLOAT


def outer_reads(body: onnx.GraphProto) -> list[str]:
    """The values ``body`` (its nested bodies included) reads from the scopes around it, in
    the order first read."""
    made = {i.name for i in body.input} | {i.name for i in body.initializer}
    reads: list[str] = []
    for node in body.node:
        for name in [*node.input, *(r for _, g in subgraphs(node) for r in outer_reads(g))]:
            if name and name not in made and name not in reads:
                reads.append(name)
        made.update(node.output)
    return reads


def cast_outer_reads(graph: onnx.GraphProto, control: list[str], floats: set[str]) -> None:
    """Each FP32 value of ``graph`` (``floats``: those FP32 before the conversion) that a body
    of a node in ``control`` reads is cast to FP32 for it (the conversion may have made it
    FP16; a Cast of an FP32 value is a no-op), so the bodies see the types they were written
    for."""
    from onnx import TensorProto, helper

    inputs = {i.name for i in graph.input}
    nodes = list(graph.node)
    graph.ClearField("node")
    for node in nodes:
        if node.name in control:
            renamed: dict[str, str] = {}
            for name in {r for _, g in subgraphs(node) for r in outer_reads(g)} & floats - inputs:
                renamed[name] = f"{name}__fp32_for_{node.name}"
                graph.node.append(helper.make_node("Cast", [name], [renamed[name]],
                                                   name=renamed[name], to=TensorProto.FLOAT))
            for _, body in subgraphs(node):
                rename_reads(body, renamed)
        graph.node.append(node)


def rename_reads(body: onnx.GraphProto, renamed: dict[str, str]) -> None:
    """Point the reads of ``body`` and its nested bodies at the renamed values."""
    for node in body.node:
        for k, name in enumerate(node.input):
            if name in renamed:
                node.input[k] = renamed[name]
        for _, g in subgraphs(node):
            rename_reads(g, renamed)


def convert_bodies(source: onnx.ModelProto, converted: onnx.ModelProto, name: str,
                   feed: dict[str, np.ndarray], spec: Fp16Job,
                   blocked: dict[str, str], kept: dict[str, str]) -> None:
    """Convert each body of control-flow node ``name`` of ``converted`` as a standalone model:
    its outer reads become FP32 inputs (typed by shape inference of ``source`` and fed with
    their values on ``feed``), its outputs stay FP32; a body that takes formal inputs (Loop,
    Scan), whose reads cannot be typed, the If branch ``feed`` does not take, or one that does
    not run alone on ``feed`` stays FP32."""
    import numpy as np
    import onnx

    node = next(n for n in converted.graph.node if n.name == name)
    original = next(n for n in source.graph.node if n.name == name)
    taken = None  # the If branch the reference input takes: the only one its gates check
    if original.op_type == "If" and feed:
        cond = outer_values(source, [original.input[0]], feed)[original.input[0]]
        taken = "then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch"
    for (attribute, body), (_, body_fp32) in zip(subgraphs(node), subgraphs(original),
                                                     strict=True):
        where = f"{name}/{attribute}"
        reads = outer_reads(body_fp32)
        if len(body.input):
            kept[where] = "a body with formal inputs (Loop, Scan) is kept FP32 whole"
            continue
        if taken is not None and attribute != taken:
            kept[where] = "the reference input does not take this branch, so no sample " \
                          "checks its FP16"
            continue
        lifted = onnx.helper.make_model(
            onnx.helper.make_graph(list(body_fp32.node), where, [], list(body_fp32.output),
                                   list(body_fp32.initializer)),
            opset_imports=list(source.opset_import), ir_version=source.ir_version)
        lifted.graph.input.extend(outer_inputs(source, reads))
        typed_outputs(lifted)
        if len(lifted.graph.input) < len(reads):
            kept[where] = "shape inference cannot type the values it reads"
            continue
        body_feed = outer_values(source, reads, feed) if feed else {}
        problem = run_problem(lifted, body_feed) if feed else "no reference inputs"
        if problem is not None:
            kept[where] = f"the reference inputs do not run it alone, so its FP16 cannot be " \
                          f"checked ({problem[:120]})"
            continue
        try:
            lifted16 = convert_graph(lifted, body_feed, spec, blocked, kept, True)
        except RuntimeError as e:
            kept[where] = str(e)[:200]
            continue
        put_back(body, lifted16.graph, lifted, where)


def typed_outputs(lifted: onnx.ModelProto) -> None:
    """Give ``lifted``'s outputs the types shape inference finds where the body left them
    untyped (keep_io_types keeps only typed FP32 outputs FP32)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(lifted, strict_mode=False).graph
    found = {v.name: v for v in [*inferred.value_info, *inferred.output]
             if v.type.tensor_type.elem_type}
    for k, output in enumerate(lifted.graph.output):
        if not output.type.tensor_type.elem_type and output.name in found:
            lifted.graph.output[k].CopyFrom(found[output.name])


def outer_inputs(source: onnx.ModelProto, reads: list[str]) -> list[onnx.ValueInfoProto]:
    """A ValueInfoProto for each of ``reads`` that shape inference of ``source`` types."""
    import onnx

    g = onnx.shape_inference.infer_shapes(source, strict_mode=False).graph
    infos = {v.name: v for v in [*g.input, *g.value_info, *g.output]
             if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}
    for node in g.node:  # Constant outputs inference may leave untyped in old opsets
        if node.op_type == "Constant" and node.output[0] not in infos:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                infos[node.output[0]] = onnx.helper.make_tensor_value_info(
                    node.output[0], value.data_type, list(value.dims))
    for init in g.initializer:
        infos.setdefault(init.name, onnx.helper.make_tensor_value_info(
            init.name, init.data_type, list(init.dims)))
    return [infos[r] for r in reads if r in infos]


def outer_values(source: onnx.ModelProto, reads: list[str], feed: dict[str, np.ndarray]
                 ) -> dict[str, np.ndarray]:
    """The values of ``reads`` when ``source`` runs on ``feed`` (FP32, in ONNX Runtime)."""
    from trtpack.runtimes.onnxruntime import cpu_session

    probe = source.__class__.FromString(source.SerializeToString())
    outputs = {o.name for o in probe.graph.output}
    probe.graph.output.extend(i for i in outer_inputs(source, reads) if i.name not in outputs)
    session = cpu_session(probe, few_runs=True)
    names = {i.name for i in session.get_inputs()}
    values = session.run(reads, {k: v for k, v in feed.items() if k in names})
    return dict(zip(reads, values, strict=True))


def put_back(body: onnx.GraphProto, graph: onnx.GraphProto, lifted: onnx.ModelProto,
             where: str) -> None:
    """Replace ``body``'s nodes with ``graph``'s (its converted form): the values and nodes the
    conversion added get ``where`` as a prefix (names must be unique across scopes)."""
    known = {i.name for i in lifted.graph.input} | {o.name for o in lifted.graph.output}
    for n in lifted.graph.node:
        known.update(n.output)
    known.update(i.name for i in lifted.graph.initializer)
    renamed = {v: f"{where}/{v}" for n in graph.node for v in n.output if v not in known}
    renamed.update((i.name, f"{where}/{i.name}") for i in graph.initializer
                   if i.name not in known)
    original_names = {n.name for n in lifted.graph.node}
    for n in graph.node:
        n.output[:] = [renamed.get(v, v) for v in n.output]
        if n.name not in original_names:
            n.name = f"{where}/{n.name}"
    rename_reads(graph, renamed)
    for i in graph.initializer:
        i.name = renamed.get(i.name, i.name)
    for v in graph.value_info:
        v.name = renamed.get(v.name, v.name)
    body.ClearField("node")
    body.node.extend(in_order(list(graph.node)))
    body.ClearField("initializer")
    body.initializer.extend(graph.initializer)
    clear_value_info(body)


def clear_value_info(body: onnx.GraphProto) -> None:
    """Drop the types recorded in ``body`` and its nested bodies: those the converter left
    there contradict the casts around the bodies converted alone; ONNX Runtime infers them."""
    body.ClearField("value_info")
    for node in body.node:
        for _, g in subgraphs(node):
            clear_value_info(g)
