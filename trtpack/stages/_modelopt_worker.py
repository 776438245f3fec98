"""Runs one NVIDIA ModelOpt conversion in its own process: ``python -m
trtpack.stages._modelopt_worker JOB.json``.

ModelOpt is isolated because it monkeypatches ``onnxruntime.quantization``, drops temporary
files (``sym_shape_infer_temp.onnx``, ``<uuid>.data``, ``augmented_model.onnx``) in the
current directory and logs an NVML error on machines without a GPU. The precision stage
starts this module with a throw-away working directory and captures its output into the
stage log. The job (JSON) says:

    mode          "int8" (ModelOpt ONNX PTQ, Q/DQ) or "fp16" (ModelOpt AutoCast)
    input         FP32 ONNX path (its external data file, if any, beside it)
    output        where to write the converted model (external data as ``<name>.data``
                  when the model is over the protobuf limit)
    result        where to write a JSON result (seconds, ...)
    int8          calibration (feeds .npz, see trtpack.calibration.save_feeds),
                  calibration_method, high_precision, nodes_to_exclude (exact names),
                  op_types_to_exclude, op_types_to_quantize (empty: ModelOpt's default),
                  dedicated_qdq (default true: with op_types_to_quantize, nodes that are
                  not quantized read the original tensor, not a shared dequantized copy)
    fp16          keep_io_types, nodes_to_exclude (exact names), op_types_to_exclude,
                  reference_inputs (one .npz feed for the I/O range rule), range_nodes_file
                  (where the nodes that rule keeps in FP32 are kept between conversions)

Node names are passed as exact names and escaped here: ModelOpt treats them as regexes
matched at the start of a name, so "MatMul" would also exclude "MatMul_1".
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from trtpack.onnx_files import (
    LARGE_INITIALIZER_BYTES,
    data_path,
    save_model,
    tensor_bytes,
)

# Initializers of LARGE_INITIALIZER_BYTES or more (the simplify worker's threshold: the same
# model layout) are kept out of AutoCast (see run_fp16) and saved in the model's data file.


def _exact(names: list[str]) -> list[str]:
    return [f"^{re.escape(n)}$" for n in names]


def _calibration_reader(feeds_path: str) -> Any:
    from onnxruntime.quantization.calibrate import CalibrationDataReader

    from trtpack.calibration import load_feeds

    feeds = load_feeds(Path(feeds_path))

    class FeedReader(CalibrationDataReader):  # type: ignore[misc]
        """Batches of different shapes (bucketed to the profiles), in order."""

        def __init__(self) -> None:
            self.feeds = feeds
            self._it = iter(self.feeds)

        def get_next(self) -> dict[str, Any] | None:
            return next(self._it, None)

        def get_first(self) -> dict[str, Any]:
            return self.feeds[0]

        def rewind(self) -> None:
            self._it = iter(self.feeds)

        def __len__(self) -> int:
            return len(self.feeds)

    return FeedReader()


# ModelOpt's INT8 path needs this opset (Q/DQ with FP16 scales); it upgrades lower ones.
INT8_OPSET = 19


def prepare_int8_input(source: Path) -> tuple[Path, list[str]]:
    """ModelOpt's preprocessing steps that rewrite the whole model, done on the graph alone.

    ``quantize`` upgrades the opset to 19 and duplicates initializers shared by several
    nodes, and saves a full copy of the model (weights included) after each step. Done
    here first, on the graph without its weights (external data stays in the source's data
    file, which the copy beside it refers to), the same model reaches ``quantize`` with
    nothing left for those steps to do. Returns the path to quantize and what was done."""
    import onnx
    from modelopt.onnx.utils import duplicate_shared_constants

    model = onnx.load(str(source), load_external_data=False)
    done = []
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if 1 < version < INT8_OPSET:
        model = onnx.version_converter.convert_version(model, INT8_OPSET)
        done.append(f"opset {version} -> {INT8_OPSET}")
    model, duplicated = duplicate_shared_constants(model)
    if duplicated:
        done.append("shared initializers duplicated")
    if not done:
        return source, done
    prepared = source.with_name("modelopt-" + source.name)  # beside it: same weight file
    onnx.save_model(model, str(prepared))
    return prepared, done


def run_int8(job: dict[str, Any], work: Path) -> dict[str, Any]:
    import onnx
    from modelopt.onnx.quantization import quantize

    spec = job["int8"]
    source, prepared = prepare_int8_input(Path(job["input"]))
    tmp_out = work / "quantized.onnx"
    quantize(
        onnx_path=str(source),
        quantize_mode="int8",
        calibration_data_reader=_calibration_reader(spec["calibration"]),
        calibration_method=spec.get("calibration_method", "max"),
        calibration_eps=["cpu"],
        op_types_to_quantize=spec.get("op_types_to_quantize") or None,
        op_types_to_exclude=spec.get("op_types_to_exclude") or None,
        nodes_to_exclude=_exact(spec.get("nodes_to_exclude") or []) or None,
        high_precision_dtype=spec.get("high_precision", "fp32"),
        # weights outside the protobuf in every copy ModelOpt saves (the same model; its
        # intermediate copies are written and read faster, without protobuf serialization)
        use_external_data_format=True,
        output_path=str(tmp_out),
        log_level="INFO",
    )
    if not tmp_out.is_file():
        raise RuntimeError("ModelOpt quantize finished without writing a model")
    model = onnx.load(str(tmp_out), load_external_data=True)
    rewired: list[str] = []
    if spec.get("op_types_to_quantize") and spec.get("dedicated_qdq", True):
        from trtpack.quantization_search import dedicate_qdq

        rewired = dedicate_qdq(model, spec["op_types_to_quantize"])
    save_model(model, Path(job["output"]))
    if source != Path(job["input"]):
        source.unlink(missing_ok=True)
    return {"dedicated_qdq_rewired": rewired, "prepared": prepared}


def out_of_range_nodes(source: Path, feed: dict[str, Any], data_max: float) -> list[str]:
    """The nodes AutoCast's I/O range rule keeps in FP32: any input or output whose largest
    absolute value on ``feed`` exceeds ``data_max`` (graph inputs and every node output;
    initializers are its init_max rule's). One ONNX Runtime run with every tensor marked as
    an output, on the graph alone next to the source's weight file: unlike AutoCast's own
    reference run, no copy of the model or its weights is made."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(source), load_external_data=False)
    typed = onnx.shape_inference.infer_shapes(model)
    known = {v.name: v for v in (*typed.graph.value_info, *typed.graph.output)}
    listed = {o.name for o in model.graph.output}
    for node in model.graph.node:
        for name in node.output:
            if name and name not in listed and name in known:
                model.graph.output.append(known[name])
                listed.add(name)
    probe = source.with_name("ranges-" + source.name)  # beside the source: same weight file
    onnx.save_model(model, str(probe))
    del model, typed
    try:
        session = ort.InferenceSession(str(probe), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        values = dict(zip(names, session.run(names, feed), strict=True))
        del session
    finally:
        probe.unlink(missing_ok=True)
    absmax = {k: float(np.abs(v).max()) for k, v in {**feed, **values}.items() if v.size}
    graph = onnx.load(str(source), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type != "Constant" and any(
        absmax.get(t, 0.0) > data_max for t in (*n.input, *n.output))]


def _weight_array(tensor: Any, folder: Path) -> Any:
    """An initializer's values: from its bytes, or mapped from its external data file."""
    import numpy as np
    from onnx import helper, numpy_helper
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    if not uses_external_data(tensor):
        return numpy_helper.to_array(tensor)
    info = ExternalDataInfo(tensor)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    return np.memmap(folder / info.location, dtype=dtype, mode="r", offset=info.offset or 0,
                     shape=tuple(tensor.dims))


def fp16_initializer(values: Any, name: str) -> Any:
    """``values`` as an FP16 initializer, the way AutoCast converts one: clamped to FP16's
    range, non-zero values below its smallest subnormal set to that subnormal."""
    import numpy as np
    from onnx import numpy_helper

    top, lowest = np.finfo(np.float16).max, np.finfo(np.float16).smallest_subnormal
    array = np.clip(np.asarray(values, dtype=np.float32), -top, top)
    array = np.where((array != 0.0) & (np.abs(array) < lowest), lowest, array)
    return numpy_helper.from_array(array.astype(np.float16), name)


def strip_weights(source: Path, graph_path: Path) -> tuple[dict[str, Any], list[str]]:
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
    weights: dict[str, Any] = {}
    kept, beyond = [], []
    for t in model.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and tensor_bytes(t) >= LARGE_INITIALIZER_BYTES:
            weights[t.name] = onnx.TensorProto()
            weights[t.name].CopyFrom(t)
            if float(np.abs(_weight_array(t, source.parent)).max(initial=0.0)) > \
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


def restore_weights(model: Any, weights: dict[str, Any], folder: Path) -> list[Any]:
    """Put the stripped weights back into AutoCast's result: an FP16 initializer where it
    made the weight FP16 (a graph input of type FP16, or Cast-to-FP16 nodes reading it, which
    are removed), the FP32 one where a node still reads it as FP32. FP32 weights that are in
    an external data file stay there: they are returned for ``save_converted`` to copy."""
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
    restored, external = [], set()
    for name, tensor in weights.items():
        values = _weight_array(tensor, folder)
        as_input = inputs.get(name)
        if as_input is not None and \
                as_input.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16:
            restored.append(fp16_initializer(values, name))
            continue
        for output in cast_outputs.get(name, []):
            restored.append(fp16_initializer(values, output))
        if name in readers:
            fp32 = onnx.TensorProto()
            fp32.CopyFrom(tensor)
            restored.append(fp32)
            if fp32.data_location == onnx.TensorProto.EXTERNAL:
                external.add(name)
    kept_inputs = [i for i in graph.input if i.name not in weights]
    graph.ClearField("input")
    graph.input.extend(kept_inputs)
    graph.initializer.extend(restored)
    return [t for t in graph.initializer if t.name in external]  # the graph's own copies


def save_converted(model: Any, path: Path, external_weights: list[Any], source_folder: Path
                   ) -> None:
    """Save AutoCast's result as ``save_model`` does. ``external_weights`` are initializers
    still pointing into the source's data file: copied into ``<name>.data`` in chunks."""
    import onnx
    from onnx.external_data_helper import (
        ExternalDataInfo,
        set_external_data,
        write_external_data_tensors,
    )

    data = data_path(path)
    data.write_bytes(b"")
    for t in model.graph.initializer:
        if t.HasField("raw_data") and len(t.raw_data) >= LARGE_INITIALIZER_BYTES:
            set_external_data(t, location=data.name)
    write_external_data_tensors(model, str(path.parent))  # appends each, records offsets
    chunk = 64 << 20
    with open(data, "ab") as out:
        for t in external_weights:
            info = ExternalDataInfo(t)
            length = info.length if info.length is not None else \
                _weight_array(t, source_folder).nbytes
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
    onnx.save_model(model, str(path))


def run_fp16(job: dict[str, Any], work: Path) -> dict[str, Any]:
    import numpy as np
    from modelopt.onnx.autocast import convert_to_mixed_precision
    from modelopt.onnx.autocast.convert import DEFAULT_DATA_MAX

    spec = job["fp16"]
    source = Path(job["input"])
    range_nodes: list[str] = []
    reference = spec.get("reference_inputs")
    if reference:
        # the range rule computed once per stage and kept in a file across its conversions
        cached = Path(spec["range_nodes_file"])
        if cached.is_file():
            range_nodes = json.loads(cached.read_text())
        else:
            with np.load(reference) as data:
                feed = {k: data[k] for k in data.files}
            range_nodes = out_of_range_nodes(source, feed, DEFAULT_DATA_MAX)
            cached.write_text(json.dumps(range_nodes))
    excluded = [*(spec.get("nodes_to_exclude") or []), *range_nodes]
    # With reference inputs both of AutoCast's value rules are applied here (I/O range
    # above, initializer range in strip_weights), so AutoCast converts the graph alone: its
    # own reference run and its copies of the weights (8 GB for bert-large's 1.3 GB) are
    # skipped, and the weights are cast to FP16 one at a time afterwards.
    weights: dict[str, Any] = {}
    onnx_path = source
    if reference:
        onnx_path = source.with_name("graph-" + source.name)
        weights, beyond = strip_weights(source, onnx_path)
        excluded += beyond
    try:
        model = convert_to_mixed_precision(
            onnx_path=str(onnx_path),
            low_precision_type="fp16",
            keep_io_types=bool(spec.get("keep_io_types", True)),
            nodes_to_exclude=_exact(list(dict.fromkeys(excluded))) or None,
            op_types_to_exclude=spec.get("op_types_to_exclude") or None,
            data_max=np.inf if reference else DEFAULT_DATA_MAX,
            providers=["cpu"],
        )
    finally:
        if onnx_path != source:
            onnx_path.unlink(missing_ok=True)
    pending = restore_weights(model, weights, source.parent)
    save_converted(model, Path(job["output"]), pending, source.parent)
    return {"out_of_range_nodes": range_nodes,
            "weights_outside_autocast": len(weights)}


def preload(mode: str) -> None:
    """Import what a conversion in ``mode`` needs (ModelOpt and torch: seconds), so that a
    worker started early is ready when its job comes."""
    if mode == "int8":
        import modelopt.onnx.quantization
        import modelopt.onnx.utils
    elif mode == "fp16":
        import modelopt.onnx.autocast  # noqa: F401


def exit_with_parent() -> None:
    """End this process when the one that started it has gone (killed builds leave no
    worker behind)."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="trtpack-parent-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    exit_with_parent()
    if len(argv) == 2 and argv[0] == "--preload":
        # started ahead of its job: import first, then read the job's path from stdin
        preload(argv[1])
        argv = [sys.stdin.readline().strip()]
    if len(argv) != 1 or not argv[0]:
        sys.stderr.write("usage: python -m trtpack.stages._modelopt_worker "
                         "(JOB.json | --preload MODE < JOB-PATH)\n")
        return 2
    job = json.loads(Path(argv[0]).read_text())
    work = Path.cwd()
    started = time.perf_counter()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if job["mode"] == "int8":
        result = run_int8(job, work)
    elif job["mode"] == "fp16":
        result = run_fp16(job, work)
    else:
        sys.stderr.write(f"unknown mode {job['mode']!r}\n")
        return 2
    result["seconds"] = time.perf_counter() - started
    Path(job["result"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # done: skip the interpreter's teardown of torch and ModelOpt (about a second)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
