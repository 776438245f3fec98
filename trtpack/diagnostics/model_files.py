"""What ``trtpack inspect`` says about an ONNX file, and about the trtpack build a path belongs
to: the model's precision (read from its operators and weights), its inputs and outputs with
dtypes and dims (symbolic axes by name), its weights, where it came from, and whether ONNX
Runtime loads it here. Returns data; the CLI renders it."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.errors import UserInputError
from trtpack.model_io import ONNX_ELEM_TO_NUMPY

if TYPE_CHECKING:
    import onnx
    from tritonclient.grpc.model_config_pb2 import ModelConfig

    from trtpack.report import BuildReport

# operators that run (or mark) integer arithmetic: an INT8 model has some
INTEGER_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
                         "MatMulInteger", "QLinearMatMul", "MatMulIntegerToFloat", "QLinearConv",
                         "ConvInteger", "QAttention", "DynamicQuantizeMatMul"})
FLOAT16 = 10  # onnx.TensorProto.FLOAT16


@dataclass(frozen=True)
class TensorInfo:
    """An input or output: numpy dtype name and dims (an int, or the axis' name)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]


@dataclass
class OnnxInspection:
    """One ONNX file: what it holds, and whether ONNX Runtime loads it here (None: not
    tried)."""

    path: str
    opset: int | None
    producer: str
    nodes: int
    weights_bytes: int
    precision: str
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    runs_here: bool | None = None
    reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class BuildRecord:
    """The trtpack build a path belongs to, from its ``report.json``."""

    root: str
    model: str
    precision: str
    target: str
    profiles: tuple[str, ...]
    status: str
    trtpack_version: str | None
    written_at: str  # the report's modification time, UTC
    # the compile check's record (``engine.tensorrt_rtx.record_lines``): compiled, not run
    compile_check: tuple[str, ...] = ()
    # the model file it serves, relative to ``root``, as its package stage recorded it
    # (``pipeline.build_folder.served_model_file``); None when it served none
    served: str | None = None

    def short_profiles(self) -> list[str]:
        """Each profile as ``1x8:4x32:8x128`` when every input has the same range, else as
        recorded (``input_ids=...,attention_mask=...``)."""
        shown = []
        for profile in self.profiles:
            ranges = {part.partition("=")[2] for part in profile.split(",")}
            shown.append(ranges.pop() if len(ranges) == 1 and "" not in ranges else profile)
        return shown


def _compile_check(report: BuildReport) -> tuple[str, ...]:
    """The build's compile check as lines; none when it did not run."""
    from trtpack.engine.tensorrt_rtx import COMPILE_CHECK_STAGE, record_lines

    stage = report.stage(COMPILE_CHECK_STAGE)
    if stage is None or stage.status != "ok":
        return ()
    return tuple(record_lines(stage.metrics))


@dataclass(frozen=True)
class OnnxCheck:
    """An ONNX Runtime model of a repository (a ``--target cpu`` build's model): loaded here
    in an ONNX Runtime session, as Triton's onnxruntime backend would load it."""

    path: str
    runs_here: bool
    reasons: tuple[str, ...] = ()


def check_onnx_model(path: Path, gpu_instances: bool, has_gpu: bool) -> OnnxCheck:
    """Whether the ONNX Runtime model at ``path`` runs here: a session loads it (CPU), and
    KIND_GPU instances need a GPU."""
    if not path.is_file():
        return OnnxCheck(str(path), False, (f"{path.name} is missing",))
    if gpu_instances and not has_gpu:
        return OnnxCheck(str(path), False,
                         ("its instances are KIND_GPU and this machine has no NVIDIA GPU",))
    try:
        from trtpack.runtimes.onnxruntime import OnnxRuntimeRunner

        with OnnxRuntimeRunner(path, threads=1, few_runs=True):
            pass  # the session loads
    except ImportError as e:
        return OnnxCheck(str(path), False, (f"ONNX Runtime is not installed ({e})",))
    except Exception as e:  # onnxruntime's own error kinds: the model does not load here
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return OnnxCheck(str(path), False, (f"ONNX Runtime cannot load it: {first}",))
    return OnnxCheck(str(path), True)


def load_onnx_graph(path: Path) -> onnx.ModelProto:
    """The model's graph (weights not loaded); ``UserInputError`` when the file is not one."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf's DecodeError and its kin: not an ONNX model
        raise UserInputError(
            f"'{path}' is not an ONNX model ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else 'unreadable'})") from None
    if model.ir_version <= 0 or not model.graph.node:
        raise UserInputError(f"'{path}' is not an ONNX model (no graph in it)")
    return model


def onnx_precision(model: onnx.ModelProto) -> str:
    """``int8`` when integer operators run in the graph (how many MatMul/Gemm they feed
    aside), ``fp16`` when its weights are half precision, else ``fp32``."""
    ops = [n.op_type for n in model.graph.node]
    integer = [op for op in ops if op in INTEGER_OPS]
    if integer:
        return f"int8 ({len(integer)} quantization/integer operators)"
    halves = sum(1 for t in model.graph.initializer if t.data_type == FLOAT16)
    if halves:
        return f"fp16 ({halves} of {len(model.graph.initializer)} weight tensors in FP16)"
    return "fp32"


def served_precision(config: ModelConfig, version: Path, engine_precision: str | None
                     ) -> str | None:
    """The precision a Triton model's version folder serves: its engine's (from the
    provenance, ``engine_precision``), or read from its ONNX file's operators and weights;
    None when unknown (another backend, a missing or unreadable file)."""
    if config.platform == "tensorrt_plan":
        return engine_precision
    if config.platform != "onnxruntime_onnx" and config.backend != "onnxruntime":
        return None
    onnx_file = version / (config.default_model_filename or "model.onnx")
    try:
        return onnx_precision(load_onnx_graph(onnx_file)) if onnx_file.is_file() else None
    except UserInputError:
        return None


def _tensor(value: onnx.ValueInfoProto) -> TensorInfo:
    ttype = value.type.tensor_type
    dims: list[int | str] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                             for d in ttype.shape.dim]
    return TensorInfo(value.name, ONNX_ELEM_TO_NUMPY.get(ttype.elem_type, "?"), tuple(dims))


def inspect_onnx(path: Path, load: bool = True) -> OnnxInspection:
    """An ONNX file's precision, I/O, weights and producer; ``load``: also whether ONNX
    Runtime loads it here (a CPU session, as Triton's onnxruntime backend would)."""
    from trtpack.onnx_tools.footprint import initializer_bytes

    model = load_onnx_graph(path)
    initializers = {t.name for t in model.graph.initializer}
    found = OnnxInspection(
        path=str(path),
        opset=next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                   None),
        producer=" ".join(p for p in (model.producer_name, model.producer_version) if p)
        or "unknown", nodes=len(model.graph.node), weights_bytes=initializer_bytes(model),
        precision=onnx_precision(model),
        inputs=[_tensor(v) for v in model.graph.input if v.name not in initializers],
        outputs=[_tensor(v) for v in model.graph.output])
    if load:
        check = check_onnx_model(path, gpu_instances=False, has_gpu=False)
        found.runs_here, found.reasons = check.runs_here, list(check.reasons)
    return found


def build_record(path: Path, levels: int = 5) -> BuildRecord | None:
    """The trtpack build folder ``path`` is in or is (its ``report.json``, up to ``levels``
    folders up), as a record; None when there is none."""
    from trtpack.pipeline.build_folder import served_model_file
    from trtpack.report import REPORT, BuildReport

    folder = path.resolve() if path.is_dir() else path.resolve().parent
    for candidate in [folder, *folder.parents][: levels + 1]:
        report_file = candidate / REPORT
        if not report_file.is_file():
            continue
        try:
            report = BuildReport.load(report_file)
        except (OSError, ValueError, TypeError, KeyError):
            return None
        written = datetime.datetime.fromtimestamp(report_file.stat().st_mtime,
                                                  datetime.timezone.utc)
        served = served_model_file(report, candidate)
        return BuildRecord(str(candidate), report.model, report.precision, report.target,
                           tuple(report.profiles), report.status,
                           report.versions.get("trtpack"),
                           written.strftime("%Y-%m-%d %H:%M UTC"), _compile_check(report),
                           None if served is None else str(served.relative_to(candidate)))
    return None
