"""INT8 convolutions that ONNX Runtime runs on integer kernels on the CPU: its static
quantization (``onnxruntime.quantization.quantize_static``), calibrated on the build's
calibration split.

Dynamic quantization (``trtpack.precision.cpu.int8``) converts MatMuls only: a convolutional
model left that way runs every ``Conv`` in FP32. Here ``Conv``, ``MatMul`` and ``Gemm`` with
constant weights get Q/DQ pairs with u8 activations (one range per tensor, from the
calibration data) and s8 per-channel weights: the form ONNX Runtime's x86 QDQ transformer
turns into ``QLinearConv`` / ``QLinearMatMul`` / ``QGemm`` when it loads the model. What it
actually runs is counted off the graph it writes (``optimized_model_filepath``), never
assumed. The graph is first brought to opset 13 (per-channel ``DequantizeLinear``) and
through ONNX Runtime's quantization pre-processing (BatchNormalization folded into Conv,
constants folded), which its docs recommend before a static quantization.

ModelOpt patches ``onnxruntime.quantization`` when it loads: a process that imported it
cannot run this (FACTS: ``quantize_static`` fails after a ModelOpt quantize); trtpack runs
ModelOpt in its own worker process, and ``quantize_static_int8`` refuses to run where it was
imported rather than produce a wrong graph."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.precision.graph import COMPUTE_OP_TYPES

if TYPE_CHECKING:
    import numpy as np
    import onnx

# ONNX Runtime's integer kernels of a convolution / a weight product, in the graph it runs
CONV_INTEGER_KERNELS = ("QLinearConv", "ConvInteger", "NhwcQLinearConv")
MATMUL_INTEGER_KERNELS = ("QLinearMatMul", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
                          "QGemm", "MatMulInteger")
STATIC_FORM = ("onnxruntime static int8 (Q/DQ: u8 activations per tensor, s8 per-channel "
               "weights; Conv, MatMul, Gemm)")
PER_CHANNEL_OPSET = 13  # DequantizeLinear's axis attribute
# ONNX Runtime's calibrators, by trtpack's --calibration-method
CALIBRATORS = {"max": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
# No ``CalibMaxIntermediateOutputs``: in onnxruntime 1.32 its MinMax calibrator drops each
# full group of batches without folding it into the ranges (microsoft/onnxruntime#18893,
# the fix #20226 closed unmerged), so the ranges came from the last (count mod N) batches
# alone, or none ("No data is collected."). MinMax holds only each tensor's ReduceMin and
# ReduceMax per batch; the histogram calibrators never read the option.


@dataclass(frozen=True)
class WeightLayers:
    """Layers with a constant weight (a plain constant or a DequantizeLinear of one)."""

    convs: int
    matmuls: int  # MatMul and Gemm

    @property
    def total(self) -> int:
        return self.convs + self.matmuls


@dataclass(frozen=True)
class IntegerLayers:
    """What ONNX Runtime runs on integer kernels, counted in the graph it runs."""

    convs: int  # QLinearConv / ConvInteger / NhwcQLinearConv
    matmuls: int  # QLinearMatMul, QGemm, MatMulIntegerToFloat, ...
    kernels: dict[str, int]  # every integer kernel and its count


def weight_layers(model: onnx.ModelProto) -> WeightLayers:
    """The Conv and MatMul/Gemm nodes of ``model`` whose weight (second input) is constant:
    an initializer, a ``Constant`` node's output, or a ``DequantizeLinear`` of either."""
    inits = {i.name for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}

    def constant(name: str) -> bool:
        node = producer.get(name)
        if name in inits or (node is not None and node.op_type == "Constant"):
            return True
        return node is not None and node.op_type == "DequantizeLinear" and constant(node.input[0])

    convs = matmuls = 0
    for node in model.graph.node:
        if len(node.input) < 2 or not constant(node.input[1]):
            continue
        if node.op_type == "Conv":
            convs += 1
        elif node.op_type in ("MatMul", "Gemm"):
            matmuls += 1
    return WeightLayers(convs, matmuls)


def nested_weight_layers(model: onnx.ModelProto) -> WeightLayers:
    """The Conv and MatMul/Gemm nodes inside ``If``/``Loop``/``Scan`` bodies: ONNX Runtime's
    quantization (static and dynamic) converts the main graph's nodes only."""
    from trtpack.precision.graph import nodes_with_subgraphs

    top = {id(n) for n in model.graph.node}
    nested = [n for n in nodes_with_subgraphs(model.graph) if id(n) not in top]
    return WeightLayers(sum(n.op_type == "Conv" for n in nested),
                        sum(n.op_type in ("MatMul", "Gemm") for n in nested))


def no_int8_layers_reason(path: Path) -> str | None:
    """Why the model at ``path`` has no CPU INT8 form, or None: no Conv, MatMul or Gemm with
    a constant weight in its main graph (those in control-flow bodies named)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    if weight_layers(model).total:
        return None
    nested = nested_weight_layers(model)
    where = (f" ({nested.convs} Conv and {nested.matmuls} MatMul/Gemm are inside If/Loop/"
             "Scan bodies, which ONNX Runtime's quantization does not convert)"
             if nested.total else "")
    return ("no Conv, MatMul or Gemm with a constant weight in the main graph for ONNX "
            f"Runtime's INT8 to run on integer kernels{where}")


def has_weight_convs(path: Path) -> bool:
    """Whether the model at ``path`` has a convolution with a constant weight: the models
    whose CPU INT8 form is the static one."""
    import onnx

    return weight_layers(onnx.load(str(path), load_external_data=False)).convs > 0


def integer_layers(runtime_counts: Mapping[str, int]) -> IntegerLayers:
    """The integer kernels among the op counts of the graph ONNX Runtime runs
    (``trtpack.precision.cpu.int8.runtime_op_counts``)."""
    kernels = {op: n for op, n in runtime_counts.items()
               if n and op in (*CONV_INTEGER_KERNELS, *MATMUL_INTEGER_KERNELS)}
    return IntegerLayers(sum(kernels.get(op, 0) for op in CONV_INTEGER_KERNELS),
                         sum(kernels.get(op, 0) for op in MATMUL_INTEGER_KERNELS), kernels)


def quantize_static_int8(source: Path, work: Path, out: Path,
                         feeds: Sequence[Mapping[str, np.ndarray]], method: str = "max"
                         ) -> None:
    """``source`` (an FP32 model) quantized statically into ``out``: opset 13 at least,
    ONNX Runtime's pre-processing (skipped with the plain graph where it fails), then
    ``quantize_static`` over ``COMPUTE_OP_TYPES`` (Conv, MatMul, Gemm) calibrated on
    ``feeds`` with ``method``'s calibrator. ``work``: scratch."""
    if "modelopt" in sys.modules:
        raise RuntimeError("ONNX Runtime's static quantization cannot run in a process that "
                           "imported ModelOpt (it patches onnxruntime.quantization)")
    import onnx
    from onnx import version_converter
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from trtpack.onnx_tools.files import PROTOBUF_LIMIT, model_bytes, save_model

    class Feeds(CalibrationDataReader):  # type: ignore[misc]
        """The calibration batches (only the inputs the graph has), once each."""

        def __init__(self, names: set[str]) -> None:
            self.batches: Iterator[dict[str, np.ndarray]] = iter(
                [{k: v for k, v in feed.items() if k in names} for feed in feeds])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    if not feeds:
        raise ValueError("a static INT8 quantization needs calibration inputs")
    work.mkdir(parents=True, exist_ok=True)
    large = model_bytes(source) > PROTOBUF_LIMIT // 4
    model = onnx.load(str(source))
    names = {i.name for i in model.graph.input}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < PER_CHANNEL_OPSET:
        model = version_converter.convert_version(model, PER_CHANNEL_OPSET)
    upgraded = work / "opset" / "model.onnx"
    upgraded.parent.mkdir(exist_ok=True)
    save_model(model, upgraded)
    del model
    prepared = work / "prepared" / "model.onnx"
    prepared.parent.mkdir(exist_ok=True)
    try:
        quant_pre_process(str(upgraded), str(prepared), skip_symbolic_shape=True,
                          save_as_external_data=large)
    except Exception:  # its optimizer or shape inference on a graph it cannot take
        prepared = upgraded
    out.parent.mkdir(parents=True, exist_ok=True)
    quantize_static(
        str(prepared), str(out), Feeds(names),
        quant_format=QuantFormat.QDQ, op_types_to_quantize=list(COMPUTE_OP_TYPES),
        per_channel=True, reduce_range=False, activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=getattr(CalibrationMethod, CALIBRATORS.get(method, "MinMax")),
        use_external_data_format=large)
