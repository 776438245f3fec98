"""Which INT8 model ONNX Runtime serves on the CPU, tried in order, each gated on the profile
corners and the held-out split before it is served:

  1. every weight MatMul INT8 on the integer kernels, the feed-forward outlier channels FP32;
  2. the Q/DQ search (``trtpack.precision.int8.conversion``) only if 1 fails, then the same form
     with the layers the search kept in FP32 kept FP32;
  3. the searched Q/DQ graph itself (ONNX Runtime runs most of it in FP32).

For ``--target cpu`` (``--precision int8`` or ``auto``) the precision stage does not run:
the search runs here, and only when the first form fails (``search_on_demand``). Beside a GPU
engine (``--fallback-cpu``) the precision stage has searched already and its kept layers are
read off its Q/DQ model. ``--min-int8-share`` is judged on the model served, counted as ONNX
Runtime runs it (weight MatMuls on integer kernels).

A convolutional model (a Conv with a constant weight) takes none of these forms: its CPU
INT8 model is ONNX Runtime's static quantization of Conv, MatMul and Gemm
(``trtpack.stages.cpu_conv_int8``), served when it passes its gates and is faster, else the
FP32 model with the reason."""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.cases import Case
from trtpack.errors import AccuracyError
from trtpack.options import BuildPlan
from trtpack.report import JsonObject, VerificationRow
from trtpack.stages.base import StageContext, StageOutcome

if TYPE_CHECKING:
    import onnx

    from trtpack.precision.calibration.data import CalibrationData
    from trtpack.precision.cpu.fusion import GraphShape
    from trtpack.precision.cpu.int8 import CpuInt8Form
    from trtpack.verify.samples import Tokenizer

CHECK_INT8 = "cpu-int8-vs-fp32"
CHECK_INT8_HELDOUT = "cpu-int8-heldout"
QDQ_FORM = "int8 Q/DQ (the searched graph; ONNX Runtime runs most of it in FP32)"


@dataclass
class ServedInt8:
    """The INT8 model chosen to serve and what was tried to get there."""

    path: Path
    rows: list[VerificationRow]  # the served model's gates (none: nothing INT8 is served)
    passed: bool
    form: str  # what is served, for the report
    share: tuple[int, int]  # weight MatMuls on integer kernels, of all, as ONNX Runtime runs
    integer_kernels: dict[str, int]
    kept_nodes: list[str] = field(default_factory=list)
    kept_layers: list[str] = field(default_factory=list)
    outlier_channels: dict[str, list[int]] = field(default_factory=dict)
    tried: list[JsonObject] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    search: StageOutcome | None = None  # the Q/DQ search's outcome, where it ran here
    warnings: list[str] = field(default_factory=list)
    # a convolutional model's static INT8 candidate (``cpu_conv_int8``): its worst sample,
    # integer-kernel Conv count and p50 per corner; and why FP32 is served instead, if it is
    candidate: JsonObject | None = None
    fp32_reason: str | None = None


def verify_rows(ctx: StageContext, path: Path, cases: list[Case], check: str, precision: str
                ) -> list[VerificationRow]:
    """``path`` judged at the profile corners (``cases``) against the FP32 outputs."""
    from trtpack.verify.compare import compare_cases, run_onnxruntime, saved_tokenizer_text

    recipe = ctx.plan.recipe
    return compare_cases(check, recipe, precision, cases, run_onnxruntime(path, cases),
                         saved_tokenizer_text(ctx.artifacts.tokenizer, recipe))


def serve_int8(ctx: StageContext, work: Path, source: Path, graph_shape: GraphShape,
               cases: list[Case]) -> ServedInt8:
    """The first CPU INT8 form that passes its gates (``--min-int8-share`` among them),
    else the searched Q/DQ graph (see the module docstring)."""
    from trtpack.precision.cpu.int8 import (
        EVERY_LAYER,
        EVERY_LAYER_SMOOTHED,
        SEARCH_LAYERS,
        fp32_weight_matmuls,
        held_out_cases,
        held_out_rows,
        make_cpu_int8,
    )

    settings = ctx.plan.recipe.precision_options.int8
    cal, tokenizer = calibration(ctx)
    held = held_out_cases(ctx.needs(ctx.artifacts.onnx, "onnx"), cal)
    served: ServedInt8 | None = None
    tried: list[JsonObject] = []
    search = None
    form_failures: list[str] = []
    qdq = ctx.artifacts.precision_onnx
    for index, name in enumerate((EVERY_LAYER, SEARCH_LAYERS)):
        if name == SEARCH_LAYERS and qdq is None:
            ctx.progress("the first CPU INT8 form failed its gates: searching the layers to "
                         "keep in FP32 (Q/DQ search)")
            search = run_search(ctx)
            qdq = search.artifacts.precision_onnx
        kept = [] if name == EVERY_LAYER else fp32_weight_matmuls(qdq) if qdq else []
        producers = EVERY_LAYER_SMOOTHED if name == EVERY_LAYER \
            else settings.smoothquant_producers or None
        ctx.progress(f"CPU INT8 form {index + 1}/2: {name}")
        try:
            form = make_cpu_int8(name, source, work / f"int8-{index}",
                                 ctx.stage_dir / f"int8-{index}" / "model.onnx", graph_shape,
                                 cal.feeds, settings.smoothquant, producers, kept)
        except Exception as e:  # ONNX Runtime's optimizer or quantizer on a graph it cannot
            # take (GPT-2's fusion on a Gemm without bias): a form not built is a failed form
            reason = f"{name} could not be built: {type(e).__name__}: {e}"[:300]
            if tried:
                tried[-1]["status"] = "superseded"
            tried.append({"form": name, "passed": False, "failures": [reason],
                          "status": "failed"})
            form_failures = [reason]
            continue
        rows = verify_rows(ctx, form.path, cases, CHECK_INT8, "int8")
        rows += held_out_rows(CHECK_INT8_HELDOUT, ctx.plan.recipe, held, form.path, cal,
                             tokenizer)
        served = describe_form(ctx, form, rows, work)
        form_failures = served.failures
        if tried:  # a later form replaced the one before: not a failure
            tried[-1]["status"] = "superseded"
        tried.append({"form": name, "passed": served.passed, "failures": served.failures,
                      "status": "served" if served.passed else "failed"})
        if served.passed:
            break
    if (served is None or not served.passed) and qdq is not None:
        served = describe_qdq(ctx, qdq, search, form_failures, work)
    assert served is not None, "the Q/DQ search ran when no CPU form passed"
    for index in range(2):
        if ctx.stage_dir / f"int8-{index}" / "model.onnx" != served.path:
            shutil.rmtree(ctx.stage_dir / f"int8-{index}", ignore_errors=True)
    if served.path.parent.name.startswith("int8-"):
        target = ctx.stage_dir / "int8" / "model.onnx"
        served.path.parent.rename(target.parent)
        served.path = target
    served.tried, served.search = tried, search
    served.warnings += cal.warnings
    if search is not None:
        served.warnings += [w for w in search.warnings if w not in cal.warnings]
    return served


def describe_form(ctx: StageContext, form: CpuInt8Form, rows: list[VerificationRow],
                  work: Path) -> ServedInt8:
    """A CPU INT8 form with its gates: the per-sample rows and ``--min-int8-share``."""
    from trtpack.precision.cpu.int8 import CPU_INT8_FORM, form_layer_names

    share, kernels = served_share(form.path, work)
    failures = [f"{r.check} {r.corner}: {r.reason}" for r in rows if not r.passed][:5]
    failures += share_failures(ctx.plan, share)
    kept_layers, outliers = form_layer_names(ctx.needs(ctx.artifacts.onnx, "onnx"), form)
    return ServedInt8(form.path, rows, not failures, f"int8, {CPU_INT8_FORM}; {form.name}",
                      share, kernels, form.excluded, kept_layers, outliers,
                      failures=failures)


def describe_qdq(ctx: StageContext, qdq: Path, search: StageOutcome | None,
                 form_failures: list[str], work: Path) -> ServedInt8:
    """The Q/DQ graph served on the CPU: its gates are the search's (its corners and the
    held-out split; beside a GPU engine the precision stage gated them), then
    ``--min-int8-share`` as ONNX Runtime runs it."""
    from trtpack.precision.cpu.int8 import fp32_weight_matmuls

    rows = list(search.verification) if search is not None else []
    share, kernels = served_share(qdq, work)
    passed = all(r.passed for r in rows)
    failures = share_failures(ctx.plan, share)
    if passed and failures:
        raise AccuracyError(
            "int8: no INT8 model for the CPU passes its gates: the CPU INT8 forms failed ("
            + "; ".join(form_failures[:2]) + ") and the searched Q/DQ graph runs "
            + failures[0])
    return ServedInt8(qdq, rows, passed, QDQ_FORM, share, kernels,
                      fp32_weight_matmuls(qdq), failures=form_failures)


def served_share(path: Path, work: Path) -> tuple[tuple[int, int], dict[str, int]]:
    """(weight MatMuls on integer kernels, all weight MatMuls) of the model at ``path`` as
    ONNX Runtime runs it on this CPU (its own QDQ fusions applied at load), and the integer
    kernels it runs."""
    import onnx

    from trtpack.precision.cpu.int8 import INTEGER_KERNELS, runtime_op_counts, weight_matmul_share

    counts = runtime_op_counts(path, work)
    kernels = {op: counts[op] for op in INTEGER_KERNELS if counts.get(op)}
    model = onnx.load(str(path), load_external_data=False)
    quantized, total = weight_matmul_share(model)
    if not quantized:  # a Q/DQ graph: its weight MatMuls, and the integer kernels ORT fused
        total = qdq_weight_matmuls(model)
        fused = sum(counts.get(op, 0) for op in ("QLinearMatMul", "MatMulIntegerToFloat",
                                                 "DynamicQuantizeMatMul", "QGemm"))
        quantized = min(total, fused + 3 * counts.get("QAttention", 0))
    return (quantized, total), kernels


def qdq_weight_matmuls(model: onnx.ModelProto) -> int:
    """MatMul/Gemm nodes of a Q/DQ graph whose second input is a weight (a constant or a
    DequantizeLinear of one)."""
    inits = {i.name for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}

    def constant(name: str) -> bool:
        node = producer.get(name)
        return name in inits or (node is not None and node.op_type == "DequantizeLinear"
                                 and node.input[0] in inits)

    return sum(1 for n in model.graph.node
               if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and constant(n.input[1]))


def share_failures(plan: BuildPlan, share: tuple[int, int], layers: str = "weight MatMuls"
                   ) -> list[str]:
    """``--min-int8-share`` on a served CPU model (only where the CPU model is what the
    build serves: beside a GPU engine the engine's Q/DQ model is gated instead);
    ``layers``: what ``share`` counts."""
    quantized, total = share
    if plan.target.is_gpu or not total or quantized / total >= plan.min_int8_share:
        return []
    return [f"{quantized}/{total} {layers} on integer kernels "
            f"({quantized / total:.0%}), under --min-int8-share {plan.min_int8_share:.0%}"]


def run_search(ctx: StageContext) -> StageOutcome:
    """The precision stage's INT8 conversion (the Q/DQ search), run here into
    ``<stage>/search`` (``--min-int8-share`` is judged on the model served instead)."""
    from trtpack.stages.precision import convert

    folder = ctx.stage_dir / "search"
    folder.mkdir()
    return convert(dataclasses.replace(ctx, stage_dir=folder), "int8", share_gate=False)


def calibration(ctx: StageContext) -> tuple[CalibrationData, Tokenizer | None]:
    """The INT8 build's calibration data (the precision stage's loader: the same file, seed
    and splits) and the tokenizer it was read with."""
    from trtpack.precision.calibration.data import load_build_calibration
    from trtpack.precision.calibration.text_batches import saved_tokenizer

    folder = ctx.artifacts.tokenizer
    return load_build_calibration(
        ctx.plan, ctx.needs(ctx.artifacts.onnx, "onnx"),
        lambda: None if folder is None else saved_tokenizer(ctx.plan.recipe, folder))
