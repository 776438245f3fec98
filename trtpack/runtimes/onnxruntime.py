"""The one place ONNX Runtime sessions are made (CPU execution provider, quiet logging).

A model is given as a file (its sidecar beside it) or in memory: serialized in memory when it
fits in one protobuf, else saved with external data to a temporary folder, which the session
no longer needs once created.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from trtpack.onnx_tools.files import fits_in_protobuf


def cpu_session(model: Any, threads: int | None = None, inter_op_threads: int | None = None,
                few_runs: bool = False, optimized_model_path: Path | None = None,
                spinning: bool = True) -> Any:
    """An ``onnxruntime.InferenceSession`` on the CPU of ``model`` (a ``Path`` or an
    ``onnx.ModelProto``); ``threads`` caps intra-op threads (None: ONNX Runtime's default).

    ``few_runs``: for a session run a few times (a check on the profile corners, a probe run
    once). Weights are not pre-packed (it costs seconds at creation on a large model and a
    packed copy of every MatMul weight, which pays off only over many runs), and nodes run in
    the graph's own order where they can (priority-based: a tensor read by a node placed right
    after its producer is freed then, not at the end of the run). ONNX Runtime's memory arena
    stays on: without it these runs peak higher. Figures: benchmarks/README.md, "Figures
    behind design choices".

    ``optimized_model_path``: where ONNX Runtime writes the graph it runs after its own
    optimizations (what kernels run: ``MatMulIntegerToFloat`` or ``DequantizeLinear`` ->
    ``MatMul``). ``spinning=False``: idle intra-op threads sleep instead of spinning (when
    several sessions take turns on the same cores, a spinning pool slows the next one)."""
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if few_runs:
        options.add_session_config_entry("session.disable_prepacking", "1")
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    if optimized_model_path is not None:
        options.optimized_model_filepath = str(optimized_model_path)
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if threads:
        options.intra_op_num_threads = threads
    if inter_op_threads:
        options.inter_op_num_threads = inter_op_threads
    with tempfile.TemporaryDirectory(prefix="trtpack-session-") as tmp:
        source: Any
        if isinstance(model, Path):
            source = str(model)
        elif fits_in_protobuf(model):
            source = model.SerializeToString()
        else:
            source = os.path.join(tmp, "model.onnx")
            onnx.save_model(model, source, save_as_external_data=True,
                            all_tensors_to_one_file=True, location="model.onnx.data")
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def run_session(session: Any, feeds: Iterable[Mapping[str, Any]], workers: int = 1
                ) -> list[dict[str, Any]]:
    """Every output of ``session`` for each feed (inputs the model does not take are
    ignored), ``workers`` feeds at a time (ONNX Runtime runs a session from several threads;
    give such a session one thread of its own)."""
    from concurrent.futures import ThreadPoolExecutor

    names = [o.name for o in session.get_outputs()]
    inputs = {i.name for i in session.get_inputs()}

    def run(feed: Mapping[str, Any]) -> dict[str, Any]:
        values = session.run(names, {k: v for k, v in feed.items() if k in inputs})
        return dict(zip(names, values, strict=True))

    if workers <= 1:
        return [run(feed) for feed in feeds]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(run, feeds))


def with_outputs(model: Any, tensors: Iterable[str]) -> Any:
    """A copy of ``model`` (``onnx.ModelProto``) that also outputs ``tensors`` (intermediate
    values)."""
    import onnx

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    listed = {o.name for o in probe.graph.output}
    for name in tensors:
        if name not in listed:
            probe.graph.output.append(onnx.ValueInfoProto(name=name))
    return probe
