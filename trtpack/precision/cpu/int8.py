"""INT8 that ONNX Runtime runs on integer kernels on the CPU.

The TensorRT-shaped Q/DQ graph (signed int8, Q nodes feeding several consumers) runs on x86
ONNX Runtime as DequantizeLinear -> FP32 MatMul: its QDQ fusions need u8 activations and
single-consumer Q nodes. ONNX Runtime's dynamic quantization of the fused CPU graph
(``trtpack.precision.cpu.fusion``) becomes ``DynamicQuantizeMatMul`` / ``MatMulIntegerToFloat``
and ``QAttention`` (u8 activations quantized per batch, s8 per-channel weights): what its
docs recommend for transformers on CPU. The layers the INT8 search kept in FP32 (read off the
searched Q/DQ model: its MatMuls without a DequantizeLinear weight) stay FP32 here too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.cases import Case
from trtpack.report import VerificationRow
from trtpack.sources.recipe import Recipe

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from trtpack.options import BuildPlan
    from trtpack.precision.calibration.data import CalibrationData
    from trtpack.precision.cpu.fusion import GraphShape
    from trtpack.precision.cpu.outlier_channels import OutlierSplit
    from trtpack.verify.samples import TokenDecoder

# ONNX Runtime's integer kernels, counted in the graph it runs (report)
INTEGER_KERNELS = ("MatMulInteger", "QLinearMatMul", "MatMulIntegerToFloat",
                   "DynamicQuantizeMatMul", "QAttention", "QGemm", "QLinearConv",
                   "ConvInteger", "DynamicQuantizeLinear")
# what the dynamic quantization converts (weights constant: activations x activations stay)
DYNAMIC_OP_TYPES = ("MatMul", "Attention")
CPU_INT8_FORM = "onnxruntime dynamic int8 (u8 activations per batch, s8 per-channel weights)"
# The CPU INT8 forms, tried in this order; the first that passes its gates is served.
EVERY_LAYER = "every weight MatMul int8, outlier channels fp32"
SEARCH_LAYERS = "the int8 search's fp32 layers kept"
# SmoothQuant of the first form: LayerNorm outputs only (their Mul is on the narrow
# activations; the wide GELU output's outliers are split off instead)
EVERY_LAYER_SMOOTHED = ("LayerNormalization",)


def search_on_demand(plan: BuildPlan) -> bool:
    """INT8 served by ONNX Runtime alone (``--target cpu``, ``--precision int8`` or
    ``auto``): the first CPU INT8 form is gated first, and the Q/DQ search (the GPU's form)
    runs in the CPU model stage only when it fails; beside a GPU engine it always runs."""
    return bool(plan.precision == "int8" and not plan.target.is_gpu)


@dataclass
class CpuInt8Form:
    """One CPU INT8 candidate: the fused graph, dynamically quantized."""

    name: str  # EVERY_LAYER or SEARCH_LAYERS
    path: Path
    kept: list[str]  # the Q/DQ search's FP32 MatMuls kept FP32 here too (SEARCH_LAYERS)
    excluded: list[str]  # fused-graph nodes left out of the quantization for them
    attention_sources: dict[str, list[str]] = field(default_factory=dict)
    outliers: list[OutlierSplit] = field(default_factory=list)


def make_cpu_int8(name: str, source: Path, work: Path, out: Path, shape: GraphShape,
                  feeds: Sequence[Mapping[str, np.ndarray]], alpha: float | None,
                  producers: Sequence[str] | None, kept: Sequence[str]) -> CpuInt8Form:
    """``source`` (the FP32 model) smoothed (``alpha`` not None; ``producers`` limit the
    activations), fused (``cpu_fusion.cpu_graph`` with ``shape``'s keyword arguments), its
    feed-forward outlier channels split off, then quantized into ``out`` with ``kept``
    (MatMul names of the source) and the outlier branches left FP32. ``work``: scratch."""
    import onnx

    from trtpack.onnx_tools.files import save_model
    from trtpack.precision.cpu.fusion import cpu_graph
    from trtpack.precision.cpu.kernels import split_bias_gelus
    from trtpack.precision.cpu.outlier_channels import split_outlier_channels

    work.mkdir(parents=True)
    int8_source = source
    if alpha is not None and feeds:
        from trtpack.precision.smoothquant import smooth_model

        model = onnx.load(str(source))
        smooth_model(model, feeds, alpha, list(producers) if producers else None)
        unsmooth_kept(model, kept)
        int8_source = work / "smoothed" / "model.onnx"
        int8_source.parent.mkdir()
        save_model(model, int8_source)
    graph = cpu_graph(int8_source, **shape)
    outliers = split_outlier_channels(graph.model, feeds)
    split_bias_gelus(graph.model)  # the bias goes into DynamicQuantizeMatMul at load
    fused = work / "fused" / "model.onnx"
    fused.parent.mkdir()
    save_model(graph.model, fused)
    excluded = excluded_in_cpu_graph(kept, graph.model, graph.attention_sources)
    out.parent.mkdir(parents=True, exist_ok=True)
    quantize_cpu_graph(fused, out, [*excluded, *(n for o in outliers for n in o.fp32_nodes)])
    return CpuInt8Form(name, out, list(kept), excluded, graph.attention_sources, outliers)


def fp32_weight_matmuls(qdq_model: Path) -> list[str]:
    """The MatMul/Gemm nodes of a Q/DQ model whose weight is a constant, not a
    DequantizeLinear output: the layers the INT8 search kept in high precision."""
    import onnx

    model = onnx.load(str(qdq_model), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    kept = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        weight = node.input[1]
        source = producer.get(weight)
        if weight in inits or (source is not None and source.op_type in ("Constant", "Cast",
                                                                             "Transpose")):
            kept.append(node.name)
    return kept


def excluded_in_cpu_graph(kept: Sequence[str], model: onnx.ModelProto,
                          attention_sources: Mapping[str, Sequence[str]]) -> list[str]:
    """The CPU graph's nodes to leave in FP32: the kept MatMuls themselves, and each fused
    Attention whose Q, K or V projection was kept."""
    names = {n.name for n in model.graph.node}
    excluded = [n for n in kept if n in names]
    excluded += [att for att, parts in attention_sources.items()
                 if att in names and any(p in kept for p in parts)]
    return excluded


def quantize_cpu_graph(fp32_model: Path, out: Path, excluded: Sequence[str]) -> None:
    """``fp32_model`` (the fused CPU graph) quantized dynamically into ``out`` (its weights
    inline: an int8 model of a few hundred MB at most; a larger one is written with a
    sidecar)."""
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from trtpack.onnx_tools.files import PROTOBUF_LIMIT, model_bytes

    quantize_dynamic(
        str(fp32_model), str(out), op_types_to_quantize=list(DYNAMIC_OP_TYPES),
        per_channel=True, reduce_range=False, weight_type=QuantType.QInt8,
        nodes_to_exclude=list(excluded),
        use_external_data_format=model_bytes(fp32_model) > PROTOBUF_LIMIT // 4,
        # FLOAT where shape inference stops at a contrib operator (BiasGelu's outputs)
        extra_options={"MatMulConstBOnly": True, "DefaultTensorType": TensorProto.FLOAT})


def weight_matmul_share(model: onnx.ModelProto) -> tuple[int, int]:
    """(quantized, all) weight projections of a served CPU graph: a MatMul/Gemm with a
    constant weight counts 1, an Attention 3 (its packed Q, K, V); the FP32 branch of a
    layer's outlier channels is part of that layer, not one more."""
    from trtpack.precision.cpu.outlier_channels import SUFFIX

    inits = {i.name for i in model.graph.initializer}
    quantized = total = 0
    for node in model.graph.node:
        if SUFFIX in node.name:  # an outlier-channel branch: part of its layer
            continue
        if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in inits:
            total += 1
        elif node.op_type == "MatMulInteger" and node.input[1] in inits:
            total += 1
            quantized += 1
        elif node.op_type == "Attention":
            total += 3
        elif node.op_type == "QAttention":
            total += 3
            quantized += 3
    return quantized, total


def runtime_op_counts(path: Path, work: Path) -> dict[str, int]:
    """Op counts of the graph ONNX Runtime runs for ``path`` on this CPU (its own fusions
    applied at load), saved to a scratch file in ``work``."""
    import onnx

    from trtpack.runtimes.onnxruntime import cpu_session

    optimized = work / "runtime_graph.onnx"
    cpu_session(path, threads=1, few_runs=True, optimized_model_path=optimized)
    model = onnx.load(str(optimized), load_external_data=False)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    optimized.unlink()
    for extra in work.glob("runtime_graph.onnx*"):
        extra.unlink()
    return counts


def unsmooth_kept(model: onnx.ModelProto, kept: Sequence[str]) -> int:
    """Undo SmoothQuant (``trtpack.precision.smoothquant``) where every MatMul reading a
    smoothed activation stays FP32: its ``Mul(x, 1/s)`` is pure cost there. Weight rows are
    divided by ``s`` again and the MatMuls read ``x``; returns how many Muls were removed."""
    from onnx import numpy_helper

    from trtpack.precision.smoothquant import SMOOTH_PREFIX

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    removed = []
    for mul in [n for n in graph.node if n.op_type == "Mul" and n.name.startswith(SMOOTH_PREFIX)]:
        consumers = readers.get(mul.output[0], [])
        if not consumers or any(c.op_type != "MatMul" or c.name not in kept for c in consumers):
            continue
        inverse = numpy_helper.to_array(inits[mul.input[1]])
        for c in consumers:
            weight = inits[c.input[1]]
            array = numpy_helper.to_array(weight)
            weight.CopyFrom(numpy_helper.from_array(
                (array * inverse[:, None]).astype(array.dtype), weight.name))
            c.input[0] = mul.input[0]
        removed.append(mul)
        graph.initializer.remove(inits[mul.input[1]])
    for mul in removed:
        graph.node.remove(mul)
    return len(removed)


def form_layer_names(source: Path, form: CpuInt8Form
                     ) -> tuple[list[str], dict[str, list[int]]]:
    """The layers ``form`` keeps in FP32, as ``encoder.layer.3.output.dense (MatMul)`` (a
    kept Attention by its kept projections), and each feed-forward layer whose outlier
    channels it keeps in FP32 -> those channels; module paths read off ``source``."""
    import onnx

    from trtpack.precision.module_paths import display_name, module_paths

    graph = onnx.load(str(source), load_external_data=False).graph
    paths = module_paths(graph.node)
    ops = {n.name: n.op_type for n in graph.node}
    kept = [display_name(part, ops.get(part, "?"), paths)
            for node in form.excluded for part in form.attention_sources.get(node, [node])
            if part in form.kept]
    outliers = {display_name(o.matmul, "MatMul", paths): list(o.channels)
                for o in form.outliers}
    return kept, outliers


def held_out_cases(fp32_onnx: Path, cal: CalibrationData) -> list[Case]:
    """The INT8 build's held-out split (``cal``) with the FP32 model's outputs: the
    reference every CPU INT8 form is judged against."""
    from trtpack.runtimes.onnxruntime import cpu_session, run_session

    if not cal.held_out:
        return []
    reference = run_session(cpu_session(fp32_onnx, few_runs=True), cal.held_out)
    return [Case(-1, f"heldout{i}", f, o)
            for i, (f, o) in enumerate(zip(cal.held_out, reference, strict=True))]


def held_out_rows(check: str, recipe: Recipe, held: list[Case], path: Path,
                  cal: CalibrationData, tokenizer: TokenDecoder | None) -> list[VerificationRow]:
    """The INT8 form at ``path`` judged on ``held`` (``held_out_cases`` of ``cal``)."""
    from trtpack.runtimes.onnxruntime import cpu_session, run_session
    from trtpack.verify.compare import compare_cases, token_text

    if not held:
        return []
    outputs = run_session(cpu_session(path, few_runs=True), cal.held_out)
    texts = {id(f): rows for f, rows in zip(cal.held_out, cal.held_out_texts, strict=False)}
    ids, mask = recipe.input_name("token_ids"), recipe.input_name("attention_mask")
    decode = token_text(tokenizer, ids, mask) if tokenizer is not None and ids else None

    def describe(inputs: Mapping[str, np.ndarray], index: int) -> str | None:
        rows = texts.get(id(inputs))
        if rows is not None and index < len(rows):
            return rows[index]
        return decode(inputs, index) if decode is not None else None

    return compare_cases(check, recipe, "int8", held, outputs, describe)
