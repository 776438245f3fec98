"""The one place ONNX Runtime sessions are made (CPU execution provider, quiet logging).

A model is given as a file (its sidecar beside it) or in memory: serialized in memory when it
fits in one protobuf, else saved with external data to a temporary folder, which the session
no longer needs once created.

``OnnxRuntimeRunner`` is such a session behind the runner interface (``runtimes.runner``);
``cpu_session`` and ``run_session`` hand out and run the session itself, typed by what trtpack
uses of it (``CpuSession``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from trtpack.onnx_tools.files import fits_in_protobuf
from trtpack.runtimes.runner import InactiveRunnerError, ModelRunner

if TYPE_CHECKING:
    import onnx


class TensorArg(Protocol):
    """An input or output of a session, as trtpack reads it (``onnxruntime.NodeArg``)."""

    @property
    def name(self) -> str: ...


class CpuSession(Protocol):
    """What trtpack uses of ``onnxruntime.InferenceSession`` (onnxruntime ships no types):
    its inputs, its outputs, and ``run`` on one feed of tensors."""

    def get_inputs(self) -> list[TensorArg]: ...

    def get_outputs(self) -> list[TensorArg]: ...

    def run(self, output_names: Sequence[str] | None,
            input_feed: Mapping[str, np.ndarray]) -> list[np.ndarray]: ...


# Where pre-packing the weights pays off in a few runs (``few_runs_prepacked``): rows through
# each weight over the runs (bert-large's design card: 18,560 tokens over its three corners).
PREPACK_FROM_ROWS = 4096


def few_runs_prepacked(feeds: Iterable[Mapping[str, np.ndarray]]) -> bool:
    """Whether a session run once on each of ``feeds`` should pre-pack its weights after all.
    ONNX Runtime packs each MatMul/Gemm weight once when the session is made (about one pass
    over the weights) and each run is then faster per row. Both grow with the weights, so the
    rows decide: at least ``PREPACK_FROM_ROWS`` over the runs, counted as each feed's largest
    input's elements (tokens for a text model); the figures behind the threshold are in
    benchmarks/README.md, "Figures behind design choices"."""
    return sum(max((a.size for a in feed.values()), default=0) for feed in feeds) \
        >= PREPACK_FROM_ROWS


def cpu_session(model: Path | onnx.ModelProto, threads: int | None = None,
                inter_op_threads: int | None = None, few_runs: bool = False,
                optimized_model_path: Path | None = None, spinning: bool = True,
                prepacked: bool = False, optimized: bool = True) -> CpuSession:
    """An ``onnxruntime.InferenceSession`` on the CPU of ``model`` (a ``Path`` or an
    ``onnx.ModelProto``); ``threads`` caps intra-op threads (None: ONNX Runtime's default).

    ``few_runs``: for a session run a few times (a check on the profile corners, a probe run
    once). Weights are not pre-packed (it costs seconds at creation on a large model and a
    packed copy of every MatMul weight, which pays off only over many runs), and nodes run in
    the graph's own order where they can (priority-based: a tensor read by a node placed right
    after its producer is freed then, not at the end of the run). ONNX Runtime's memory arena
    stays on: without it these runs peak higher. Figures: benchmarks/README.md, "Figures
    behind design choices".

    ``prepacked``: with ``few_runs``, pre-pack the weights all the same (a few runs with many
    rows each: ``few_runs_prepacked``).

    ``optimized_model_path``: where ONNX Runtime writes the graph it runs after its own
    optimizations (what kernels run: ``MatMulIntegerToFloat`` or ``DequantizeLinear`` ->
    ``MatMul``). ``spinning=False``: idle intra-op threads sleep instead of spinning (when
    several sessions take turns on the same cores, a spinning pool slows the next one).
    ``optimized=False``: ONNX Runtime's graph optimizations off (``ORT_DISABLE_ALL``), every
    node computed as the graph writes it (its fused kernels change values' last bits)."""
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if few_runs and not prepacked:
        options.add_session_config_entry("session.disable_prepacking", "1")
    if few_runs:
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
        source: str | bytes
        if isinstance(model, Path):
            source = str(model)
        elif fits_in_protobuf(model):
            source = model.SerializeToString()
        else:
            source = os.path.join(tmp, "model.onnx")
            onnx.save_model(model, source, save_as_external_data=True,
                            all_tensors_to_one_file=True, location="model.onnx.data")
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def run_session(session: CpuSession, feeds: Iterable[Mapping[str, np.ndarray]],
                workers: int = 1) -> list[dict[str, np.ndarray]]:
    """Every output of ``session`` for each feed (inputs the model does not take are
    ignored), ``workers`` feeds at a time (ONNX Runtime runs a session from several threads;
    give such a session one thread of its own)."""
    from concurrent.futures import ThreadPoolExecutor

    names = [o.name for o in session.get_outputs()]
    inputs = {i.name for i in session.get_inputs()}

    def run(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = session.run(names, {k: v for k, v in feed.items() if k in inputs})
        return dict(zip(names, values, strict=True))

    if workers <= 1:
        return [run(feed) for feed in feeds]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(run, feeds))


def with_outputs(model: onnx.ModelProto, tensors: Iterable[str]) -> onnx.ModelProto:
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


class OnnxRuntimeRunner(ModelRunner):
    """A model in ONNX Runtime on the CPU behind the runner interface: ``activate`` makes the
    session (``cpu_session``, with these options), ``infer`` runs one feed."""

    name = "onnxruntime"

    def __init__(self, model: Path | onnx.ModelProto, threads: int | None = None, *,
                 inter_op_threads: int | None = None, few_runs: bool = False,
                 spinning: bool = True) -> None:
        self.model = model
        self.threads = threads
        self.inter_op_threads = inter_op_threads
        self.few_runs = few_runs
        self.spinning = spinning
        self._session: CpuSession | None = None

    @property
    def session(self) -> CpuSession:
        if self._session is None:
            raise InactiveRunnerError(self)
        return self._session

    def activate(self) -> None:
        self._session = cpu_session(self.model, self.threads, self.inter_op_threads,
                                    few_runs=self.few_runs, spinning=self.spinning)

    def deactivate(self) -> None:
        self._session = None

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.session.get_inputs())

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.session.get_outputs())

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        (outputs,) = run_session(self.session, [feeds])
        return outputs
