"""FP16 conversion without AutoCast copying the weights: the large float initializers are
taken out of the graph before ``convert_to_mixed_precision`` (each a graph input instead),
AutoCast's two value rules (I/O range, initializer range) are applied here, and the weights
are put back afterwards, cast to FP16 one at a time where AutoCast made them FP16.

Runs in the ModelOpt worker; onnx and onnxruntime are imported inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from trtpack.onnx_tools.files import (
    LARGE_INITIALIZER_BYTES,
    data_path,
    initializer_array,
    sort_value_info,
    tensor_bytes,
)
from trtpack.precision.graph import absmax_outputs, absmax_types

if TYPE_CHECKING:
    import numpy as np
    import onnx


def out_of_range_nodes(source: Path, feed: dict[str, np.ndarray], data_max: float) -> list[str]:
    """The nodes AutoCast's I/O range rule keeps in FP32: any input or output whose largest
    absolute value on ``feed`` exceeds ``data_max`` (graph inputs and every node output;
    initializers are its init_max rule's).

    One ONNX Runtime run on the graph alone next to the source's weight file (no copy of the
    model or its weights, unlike AutoCast's own reference run), in which the graph computes
    each tensor's largest absolute value itself (``absmax_outputs``): only those scalars come
    out and the intermediate tensors are freed as the run goes: making every tensor an output
    instead takes several times the time and much more memory, part of which the allocator
    keeps afterwards (figures: benchmarks/README.md, "Figures behind design choices")."""
    import numpy as np
    import onnx

    from trtpack.runtimes.onnxruntime import cpu_session

    model = onnx.load(str(source), load_external_data=False)
    typed = onnx.shape_inference.infer_shapes(model)
    known = {v.name: v for v in (*typed.graph.value_info, *typed.graph.output)}
    tensors = [name for node in model.graph.node for name in node.output
               if name and name in known and known[name].type.HasField("tensor_type")
               and known[name].type.tensor_type.elem_type in absmax_types()]
    del typed
    outputs = absmax_outputs(model, tensors)
    probe = source.with_name("ranges-" + source.name)  # beside the source: same weight file
    onnx.save_model(model, str(probe))
    del model
    try:
        session = cpu_session(probe, few_runs=True)
        inputs = {i.name for i in session.get_inputs()}
        values = session.run(list(outputs.values()), {k: v for k, v in feed.items()
                                                      if k in inputs})
        del session
    finally:
        probe.unlink(missing_ok=True)
    absmax = {k: float(np.abs(v).max()) for k, v in feed.items() if v.size}
    absmax.update((name, float(v)) for name, v in zip(outputs, values, strict=True))
    graph = onnx.load(str(source), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type != "Constant" and any(
        absmax.get(t, 0.0) > data_max for t in (*n.input, *n.output))]


FP16_CHUNK = 1 << 20
"""Elements converted at a time: the temporaries of one chunk stay in the CPU's cache."""


def fp16_values(values: np.ndarray) -> np.ndarray:
    """``values`` in FP16 the way AutoCast converts a weight: clamped to FP16's range,
    non-zero values below its smallest subnormal set to that subnormal. Converted a chunk at
    a time (one pass over the weight, not one per step)."""
    import numpy as np

    top, lowest = np.finfo(np.float16).max, np.finfo(np.float16).smallest_subnormal
    flat = np.asarray(values).reshape(-1)
    out = np.empty(flat.shape, dtype=np.float16)
    for start in range(0, flat.size, FP16_CHUNK):
        array = np.clip(np.asarray(flat[start:start + FP16_CHUNK], dtype=np.float32), -top, top)
        tiny = (array != 0.0) & (np.abs(array) < lowest)
        if tiny.any():
            array[tiny] = lowest
        out[start:start + FP16_CHUNK] = array
    return out.reshape(np.shape(values))


def _fp16_external(values: np.ndarray, name: str, data: BinaryIO) -> onnx.TensorProto:
    """``values`` as an FP16 initializer whose bytes are appended to ``data`` (the model's
    external data file, opened for writing) rather than held in the protobuf."""
    import onnx

    array = fp16_values(values)
    proto = onnx.TensorProto(name=name, data_type=onnx.TensorProto.FLOAT16,
                             dims=list(array.shape))
    offset = data.tell()
    array.tofile(data)
    proto.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", Path(data.name).name), ("offset", str(offset)),
                       ("length", str(array.nbytes))):
        entry = proto.external_data.add()
        entry.key, entry.value = key, value
    return proto


def strip_weights(source: Path, graph_path: Path
                  ) -> tuple[dict[str, onnx.TensorProto], list[str]]:
    """Write ``source`` without its large float initializers to ``graph_path``, each one a
    graph input of its shape and type instead. Returns those initializers (values not
    loaded when external) and the nodes AutoCast's initializer range rule would keep in FP32
    (they read a weight beyond FP16's range), which it can no longer see."""
    import numpy as np
    import onnx
    from onnx import helper

    model = onnx.load(str(source), load_external_data=False)
    readers: dict[str, list[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.name)
    weights: dict[str, onnx.TensorProto] = {}
    kept, beyond = [], []
    for t in model.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and tensor_bytes(t) >= LARGE_INITIALIZER_BYTES:
            weights[t.name] = onnx.TensorProto()
            weights[t.name].CopyFrom(t)
            if float(np.abs(initializer_array(t, source.parent)).max(initial=0.0)) > \
                    np.finfo(np.float16).max:
                beyond.extend(readers.get(t.name, []))
        else:
            kept.append(t)
    model.graph.ClearField("initializer")
    model.graph.initializer.extend(kept)
    model.graph.input.extend(helper.make_tensor_value_info(n, t.data_type, list(t.dims))
                             for n, t in weights.items())
    onnx.save_model(model, str(graph_path))
    return weights, beyond


def restore_weights(model: onnx.ModelProto, weights: dict[str, onnx.TensorProto], folder: Path,
                    data: BinaryIO) -> list[onnx.TensorProto]:
    """Put the stripped weights back into AutoCast's result: an FP16 initializer where it
    made the weight FP16 (a graph input of type FP16, or Cast-to-FP16 nodes reading it, which
    are removed), the FP32 one where a node still reads it as FP32. The FP16 weights are made
    one at a time and written to ``data`` (the output's external data file, open for
    writing) as they are made: none is held in memory, in the protobuf or beside it. FP32
    weights that are in an external data file stay there: they are returned for
    ``save_converted`` to copy."""
    import onnx

    graph = model.graph
    inputs = {i.name: i for i in graph.input}
    casts = [n for n in graph.node if n.op_type == "Cast" and n.input and n.input[0] in weights
             and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT16 for a in n.attribute)]
    cast_outputs: dict[str, list[str]] = {}
    for n in casts:
        cast_outputs.setdefault(n.input[0], []).append(n.output[0])
    drop = {id(n) for n in casts}
    nodes = [n for n in graph.node if id(n) not in drop]
    graph.ClearField("node")
    graph.node.extend(nodes)
    readers = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    external = set()
    for name, tensor in weights.items():
        values = initializer_array(tensor, folder)
        as_input = inputs.get(name)
        if as_input is not None and \
                as_input.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16:
            graph.initializer.append(_fp16_external(values, name, data))
            continue
        for output in cast_outputs.get(name, []):
            graph.initializer.append(_fp16_external(values, output, data))
        if name in readers:
            graph.initializer.append(tensor)
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                external.add(name)
    kept_inputs = [i for i in graph.input if i.name not in weights]
    graph.ClearField("input")
    graph.input.extend(kept_inputs)
    return [t for t in graph.initializer if t.name in external]  # the graph's own copies


def save_converted(model: onnx.ModelProto, path: Path, external_weights: list[onnx.TensorProto],
                   source_folder: Path
                   ) -> None:
    """Save AutoCast's result as ``save_model`` does, its data file ``<name>.data`` begun by
    ``restore_weights``: the initializers still in the protobuf are appended to it, and
    ``external_weights`` (initializers still pointing into the source's data file) are
    copied into it in chunks."""
    import onnx
    from onnx.external_data_helper import (
        ExternalDataInfo,
        set_external_data,
        write_external_data_tensors,
    )

    data = data_path(path)
    for t in model.graph.initializer:
        if t.HasField("raw_data") and len(t.raw_data) >= LARGE_INITIALIZER_BYTES:
            set_external_data(t, location=data.name)
    write_external_data_tensors(model, str(path.parent))  # appends each, records offsets
    chunk = 64 << 20
    with open(data, "ab") as out:
        for t in external_weights:
            info = ExternalDataInfo(t)
            length = info.length if info.length is not None else \
                initializer_array(t, source_folder).nbytes
            offset = out.tell()
            with open(source_folder / info.location, "rb") as src:
                src.seek(info.offset or 0)
                left = length
                while left:
                    block = src.read(min(chunk, left))
                    if not block:
                        raise ValueError(f"{info.location} ends inside tensor {t.name}")
                    out.write(block)
                    left -= len(block)
            del t.external_data[:]
            for key, value in (("location", data.name), ("offset", str(offset)),
                               ("length", str(length))):
                entry = t.external_data.add()
                entry.key, entry.value = key, value
    sort_value_info(model)
    onnx.save_model(model, str(path))
