"""onnxsim on the graph without its weights. The simplify stage runs ``simplify_file`` in a
process of its own (a crash in onnxsim's C++ code must not take the build down).

Usage: python -m trtpack.onnx_tools.simplify_graph SRC DST RESULT_JSON [rewire-gelus]

onnxsim copies a model several times over (Python proto, C++ proto, ONNX Runtime session for
constant folding, the result): about 8x the weights, 10 GB for bert-large. Its work on a
transformer is on the graph (shape arithmetic, identities, fusions), not on the big weights.
So every large initializer that no constant folding can touch (each node reading it also
reads a runtime tensor, e.g. MatMul(x, W) or Gather(E, ids)) is written once to
``DST.data`` and stands in the graph as an input of its shape and type while onnxsim runs;
afterwards it is attached again as an external initializer. Large initializers that a
foldable node reads (e.g. Transpose(W)) stay in the graph so onnxsim can fold them. The
weights are never copied in memory, and a model over 2 GB is simplified like any other.

onnxsim drops the nodes' ``metadata_props``, where the dynamo exporter records the PyTorch
module each node came from (``pkg.torch.onnx.name_scopes``). They are recorded by node
output tensor before simplifying and put back on the node that produces the same tensor
afterwards (a Gemm fused from MatMul+Add gets the Add's, the same module), so later stages
can name nodes by module path (``trtpack.precision.module_paths``).

With ``rewire_gelus`` (a graph the exporter wrote), each erf GELU is then written in the order
ONNX Runtime fuses (``trtpack.onnx_tools.gelu_form``): the same values where it runs as
written.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

# Initializers of LARGE_INITIALIZER_BYTES or more are taken out of the graph onnxsim sees and
# kept in the model's data file (the layout of every stage's model: trtpack.onnx_tools.files).
from trtpack.onnx_tools.files import DATA_SUFFIX, LARGE_INITIALIZER_BYTES, data_path, tensor_bytes
from trtpack.onnx_tools.gelu_form import rewire_erf_gelus

if TYPE_CHECKING:
    import onnx


def unfoldable_large_initializers(graph: onnx.GraphProto, min_bytes: int = LARGE_INITIALIZER_BYTES
                                  ) -> list[str]:
    """Names of initializers of at least ``min_bytes`` that constant folding cannot reach:
    every node reading one also reads a tensor that is not a constant."""
    constant = {t.name for t in graph.initializer}
    for node in graph.node:  # topologically sorted: propagate constness forward
        if all(i in constant for i in node.input if i):
            constant.update(o for o in node.output if o)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    found = []
    for t in graph.initializer:
        users = readers.get(t.name, [])
        if (t.name not in outputs and users and tensor_bytes(t) >= min_bytes
                and all(any(i and i not in constant for i in n.input) for n in users)):
            found.append(t.name)
    return found


def import_onnxsim() -> ModuleType:
    """onnxsim, imported without torch. Its package tries torch only for a bridge to PPQ,
    which also needs the ``ppq`` package (not a dependency of trtpack, which never uses the
    bridge): that try costs the simplify stage's process a torch import, in time and in
    memory while it waits beside the export (the build's memory peak). With torch absent for the
    import, the bridge is unavailable, as it is without ppq anyway; torch is importable
    again afterwards. Raises ImportError when onnxsim is not installed."""
    if "onnxsim" in sys.modules:
        return sys.modules["onnxsim"]
    hide_torch = "torch" not in sys.modules
    if hide_torch:
        sys.modules["torch"] = None  # type: ignore[assignment]  # import torch: ImportError
    try:
        import onnxsim
    finally:
        if hide_torch:
            del sys.modules["torch"]
    return onnxsim


def simplify_file(src: str, dst: str, result_path: str, rewire_gelus: bool = False) -> int:
    """onnxsim on SRC without its large weights, written to DST (+ DST.data); the counts go
    to RESULT_PATH as JSON. ``rewire_gelus``: then each erf GELU in the order ONNX Runtime
    fuses (``gelu_form.rewire_erf_gelus``). Returns the exit code."""
    import onnx
    from onnx import helper
    from onnx.external_data_helper import (
        load_external_data_for_tensor,
        set_external_data,
        uses_external_data,
        write_external_data_tensors,
    )

    src_path, dst_path = Path(src), Path(dst)
    data_name = dst_path.name + DATA_SUFFIX
    model = onnx.load(src, load_external_data=False)  # external weights stay on disk
    before = len(model.graph.node)
    if uses_any_external(model):
        # the weights already live in SRC.data: start DST.data as a copy (appended to below)
        src_data = data_path(src_path)
        shutil.copyfile(src_data, dst_path.parent / data_name)
        for t in model.graph.initializer:
            for entry in t.external_data:
                if entry.key == "location":
                    entry.value = data_name
    stripped = set(unfoldable_large_initializers(model.graph))
    for t in model.graph.initializer:
        if uses_external_data(t) and t.name not in stripped:
            load_external_data_for_tensor(t, str(dst_path.parent))  # onnxsim folds these
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]
        elif t.name in stripped and not uses_external_data(t):
            set_external_data(t, location=data_name)
    # write the stripped weights' bytes to DST.data, one tensor at a time, and drop them
    # from memory (onnx appends each to the file and records its offset)
    dst_data = dst_path.parent / data_name
    if stripped and not dst_data.exists():
        dst_data.touch()
    write_external_data_tensors(model, str(dst_path.parent))
    # fresh copies (now only names, shapes and file offsets) so the loaded model's memory
    # is released with it
    weights: dict[str, onnx.TensorProto] = {}
    for t in model.graph.initializer:
        if t.name in stripped:
            weights[t.name] = onnx.TensorProto()
            weights[t.name].CopyFrom(t)
    graph_only = onnx.ModelProto()
    graph_only.CopyFrom(model)
    del model
    kept = [t for t in graph_only.graph.initializer if t.name not in stripped]
    graph_only.graph.ClearField("initializer")
    graph_only.graph.initializer.extend(kept)
    graph_only.graph.input.extend(
        helper.make_tensor_value_info(name, t.data_type, list(t.dims))
        for name, t in weights.items())

    carried = node_metadata_by_output(graph_only)
    simplified, ok = import_onnxsim().simplify(graph_only, check_n=0)
    reattached = reattach_node_metadata(simplified, carried)
    gelus = rewire_erf_gelus(simplified) if rewire_gelus else 0

    used = {i for n in simplified.graph.node for i in n.input}
    inputs = [i for i in simplified.graph.input if i.name not in weights]
    simplified.graph.ClearField("input")
    simplified.graph.input.extend(inputs)
    simplified.graph.initializer.extend(t for name, t in weights.items() if name in used)
    # anything onnxsim folded into a large new constant goes to DST.data too
    for t in simplified.graph.initializer:
        if t.HasField("raw_data") and len(t.raw_data) >= LARGE_INITIALIZER_BYTES:
            set_external_data(t, location=data_name)
    write_external_data_tensors(simplified, str(dst_path.parent))
    if not uses_any_external(simplified):
        dst_data.unlink(missing_ok=True)
    onnx.save(simplified, dst)
    Path(result_path).write_text(json.dumps({
        "nodes_before": before, "nodes_after": len(simplified.graph.node), "check": bool(ok),
        "weights_outside_onnxsim": len(weights), "metadata_reattached": reattached,
        "gelus_rewired": gelus,
        "external_data": uses_any_external(simplified)}))
    return 0


def node_metadata_by_output(model: onnx.ModelProto) -> dict[str, list[tuple[str, str]]]:
    """{output tensor: the producing node's metadata_props (key, value)}, for nodes that
    have any."""
    found: dict[str, list[tuple[str, str]]] = {}
    for node in model.graph.node:
        props = [(p.key, p.value) for p in node.metadata_props]
        if props:
            for out in node.output:
                if out:
                    found[out] = props
    return found


def reattach_node_metadata(model: onnx.ModelProto, carried: dict[str, list[tuple[str, str]]]
                           ) -> int:
    """Give each node without metadata_props those recorded for its first output found in
    ``carried``; returns how many nodes got them."""
    count = 0
    for node in model.graph.node:
        if len(node.metadata_props):
            continue
        props = next((carried[o] for o in node.output if o in carried), None)
        if props is None:
            continue
        for key, value in props:
            entry = node.metadata_props.add()
            entry.key, entry.value = key, value
        count += 1
    return count


def uses_any_external(model: onnx.ModelProto) -> bool:
    from onnx.external_data_helper import uses_external_data

    return any(uses_external_data(t) for t in model.graph.initializer)


if __name__ == "__main__":
    source, destination, result = sys.argv[1:4]
    sys.exit(simplify_file(source, destination, result, sys.argv[4:5] == ["rewire-gelus"]))
