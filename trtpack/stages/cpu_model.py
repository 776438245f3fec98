"""CPU model: the model ONNX Runtime serves on the CPU (``--target cpu``, and the
``--fallback-cpu`` model beside a GPU engine), shaped for ONNX Runtime rather than TensorRT.

FP32: the transformer fusions (``trtpack.precision.cpu.fusion``), checked per sample against
the FP32 outputs. INT8 builds: that graph dynamically quantized on ONNX Runtime's integer
kernels (``trtpack.precision.cpu.int8``), with the layers the INT8 search kept in FP32 kept
in FP32, gated on the profile corners and the held-out split with the INT8 tolerances; if it
fails, the searched Q/DQ model is served instead (a warning says so). The graph is saved as
fused operators only: ONNX Runtime's own (instruction-set specific) optimizations run when
the model is loaded, so the file is not tied to this machine's CPU."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from trtpack.cases import Case, load_cases
from trtpack.onnx_tools.files import graph_summary, save_model
from trtpack.options import BuildPlan
from trtpack.precision.cpu import fusion
from trtpack.precision.cpu.fusion import CpuGraph
from trtpack.precision.cpu.int8 import search_on_demand
from trtpack.precision.cpu.static_int8 import has_weight_convs, no_int8_layers_reason
from trtpack.report import JsonObject, VerificationRow
from trtpack.stages.artifacts import Artifacts
from trtpack.stages.base import StageContext, StageMetrics, StageOutcome
from trtpack.stages.cpu_conv_int8 import serve_conv_int8
from trtpack.stages.cpu_int8_serving import (
    CHECK_INT8_HELDOUT,
    QDQ_FORM,
    ServedInt8,
    serve_int8,
    verify_rows,
)

# Bump when the fusion or the quantization changes what this stage writes (cache key).
CPU_FORM_VERSION = 10
CHECK_FP32 = "cpu-fp32-vs-fp32"


@dataclass
class CpuModelMetrics(StageMetrics):
    form: str  # what is served on the CPU
    optimizer_model_type: str | None
    fused_operators: dict[str, int]
    nodes_before: int
    nodes_after: int
    int8_form: str | None = None
    integer_kernels: dict[str, int] = field(default_factory=dict)  # in the graph ORT runs
    # "on integer kernels/all" of the served CPU form's Conv, MatMul and Gemm with a constant
    # weight, as ONNX Runtime runs it (reports before 2026-11-28 call it int8_weight_matmuls:
    # ``trtpack.report.int8_weight_layers`` reads either)
    int8_weight_layers: str | None = None
    int8_share: float | None = None
    kept_fp32_nodes: list[str] = field(default_factory=list)
    kept_fp32_layers: list[str] = field(default_factory=list)  # module paths of those
    int8_passed: bool | None = None
    int8_failures: list[str] = field(default_factory=list)  # why the INT8 form failed
    smoothquant: float | None = None  # alpha applied before the dynamic quantization
    # the INT8 forms tried, in order: {"form", "passed", "failures", "status"}; status is
    # "superseded" for a form the next one replaced, else "served" or "failed" (the last)
    int8_forms_tried: list[JsonObject] = field(default_factory=list)
    # feed-forward layer -> its channels kept FP32 beside the INT8 MatMul
    outlier_channels: dict[str, list[int]] = field(default_factory=dict)
    skip_layer_norms_split: int = 0  # SkipLayerNormalization run as Sum + LayerNormalization
    auto: JsonObject | None = None  # --precision auto: candidates, timings, why
    heldout_worst: float | None = None  # the served INT8 model's, on the held-out split
    # the Q/DQ search's metrics, where it ran in this stage (--target cpu, first form failed)
    search: JsonObject | None = None
    # the fusion's seconds when it ran while the stage before ran (not in this stage's time)
    head_start_seconds: float | None = None
    # a convolutional model's static INT8 candidate (``cpu_conv_int8``): worst sample,
    # integer-kernel Conv and MatMul counts, p50 per corner against FP32's
    int8_candidate: JsonObject | None = None
    int8_fp32_reason: str | None = None  # why FP32 is served instead of that candidate


def fingerprint(plan: BuildPlan) -> JsonObject:
    import importlib.metadata

    from trtpack.precision.calibration.data import calibration_path
    from trtpack.precision.calibration.files import file_sha256
    from trtpack.stages.precision import fingerprint as precision_fingerprint

    r = plan.recipe
    path = calibration_path(plan) if plan.precision == "int8" else None
    return {
        "version": CPU_FORM_VERSION,
        # the fusions and the quantizer are ONNX Runtime's: another version, another graph
        "onnxruntime": importlib.metadata.version("onnxruntime"),
        "config": r.config, "precision": plan.precision,
        "verify": r.verify.model_dump(), "outputs": [o.model_dump() for o in r.outputs],
        "calibration_sha256": file_sha256(path) if path is not None and path.is_file()
        else None,
        "int8": r.precision_options.int8.model_dump(),
        "seed": plan.seed,
        "auto_precision": plan.auto_precision,
        # --target cpu: the Q/DQ search may run here (only when the first form fails)
        "search": precision_fingerprint(plan) if search_on_demand(plan) else None,
    }


def model_shape(ctx: StageContext) -> tuple[str | None, int | None, int | None]:
    """(model_type, attention heads, hidden size) from the model's config.json, else the
    recipe's config."""
    config: JsonObject = dict(ctx.plan.recipe.config)
    path = ctx.artifacts.model_config
    if path is not None and path.is_file():
        config = {**config, **json.loads(path.read_text())}
    from trtpack.sources.architectures import attention_heads, config_hidden_size

    model_type = config.get("model_type")
    return (model_type if isinstance(model_type, str) else None, attention_heads(config),
            config_hidden_size(config))


@dataclass
class FusedGraph:
    """The fused FP32 graph, saved in the stage's folder (``fp32/model.onnx``), and what it
    was made from: ``source`` is a copy of the simplified model in ``work`` (the stage's
    scratch folder, which the INT8 forms use too)."""

    onnx: Path  # the simplified model (the ``onnx`` artifact) it was made from
    work: Path
    source: Path
    graph: CpuGraph
    fp32_path: Path
    warnings: list[str]
    seconds: float


_HEAD_STARTED: list[FusedGraph] = []  # this process's head start: one at most


def head_start(ctx: StageContext) -> None:
    """The fusion, made while the stage before this one runs (``Stage.head_start``): the FP32
    graph it reads is final once the simplify has run, and only the check of the fused
    model needs the verify stage's FP32 outputs. ``run`` takes it up."""
    _HEAD_STARTED.append(fuse(ctx))


def fuse(ctx: StageContext) -> FusedGraph:
    """The simplified model fused for ONNX Runtime on the CPU, saved as ``fp32/model.onnx``
    in the stage's folder (the plain graph, with a warning, when the optimizer fails)."""
    import time


    started = time.perf_counter()
    model_type, heads, hidden = model_shape(ctx)
    fp32_onnx = ctx.needs(ctx.artifacts.onnx, "onnx")
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=ctx.stage_dir))
    fp32_dir = ctx.stage_dir / "fp32"
    made_fp32_dir = False
    try:
        source = work / "model.onnx"
        # copies: onnx refuses a sidecar with several hard links (the stage cache's)
        shutil.copy2(fp32_onnx, source)
        data = fp32_onnx.with_name(fp32_onnx.name + ".data")
        if data.is_file():
            shutil.copy2(data, work / data.name)
        ctx.progress("fusing the transformer graph for ONNX Runtime on the CPU")
        warnings: list[str] = []
        try:
            graph = fusion.cpu_graph(source, config_model_type=model_type, num_heads=heads,
                                     hidden_size=hidden,
                                     mask_input=ctx.plan.recipe.input_name("attention_mask"),
                                     load_weights=False)
        except Exception as e:  # an optimizer crash on an unusual graph: serve the plain one
            import onnx

            ctx.log.exception("ONNX Runtime's transformer optimizer failed")
            warnings.append(f"ONNX Runtime's transformer optimizer failed ({type(e).__name__}"
                            f": {str(e)[:200]}); the CPU model is the plain FP32 graph")
            graph = CpuGraph(onnx.load(str(source), load_external_data=False), None, {})
        fp32_dir.mkdir()
        made_fp32_dir = True
        fp32_path = fp32_dir / "model.onnx"
        ctx.log.info("fused; saving it")
        save_model(graph.model, fp32_path, weights_dir=work)  # weights streamed from work
    except BaseException:  # nothing half-made stays in the stage's folder
        shutil.rmtree(work, ignore_errors=True)
        if made_fp32_dir:
            shutil.rmtree(fp32_dir, ignore_errors=True)
        raise
    return FusedGraph(fp32_onnx, work, source, graph, fp32_path, warnings,
                      time.perf_counter() - started)


def _head_started(ctx: StageContext) -> FusedGraph | None:
    """The head start's fusion, when it was made from this stage's model into its folder;
    one made from another model is removed (``run`` fuses again)."""
    while _HEAD_STARTED:
        fused = _HEAD_STARTED.pop()
        if fused.onnx == ctx.artifacts.onnx and fused.fp32_path.parent.parent == ctx.stage_dir:
            return fused
        shutil.rmtree(fused.work, ignore_errors=True)
        shutil.rmtree(fused.fp32_path.parent, ignore_errors=True)
    return None


def run(ctx: StageContext) -> StageOutcome:
    recipe = ctx.plan.recipe
    mask = recipe.input_name("attention_mask")
    model_type, heads, hidden = model_shape(ctx)
    fused = _head_started(ctx)
    head_start_seconds = fused.seconds if fused is not None else None
    if fused is not None:
        ctx.log.info("the fusion ran while the stage before ran (%.1f s)", fused.seconds)
    else:
        fused = fuse(ctx)
    work, source, graph, fp32_path = fused.work, fused.source, fused.graph, fused.fp32_path
    warnings = list(fused.warnings)
    search_note = ""
    try:
        cases = load_cases(ctx.needs(ctx.artifacts.fp32_outputs, "fp32_outputs"))
        rows = verify_rows(ctx, fp32_path, cases, CHECK_FP32, "fp32")
        ctx.log.info("the fused FP32 model checked at every corner")
        metrics = CpuModelMetrics(
            form="fp32, fused for ONNX Runtime" if graph.fused else "fp32 (no fusion matched)",
            optimizer_model_type=graph.model_type, fused_operators=graph.fused,
            nodes_before=graph_summary(source)["nodes"], nodes_after=len(graph.model.graph.node),
            skip_layer_norms_split=graph.skip_layer_norms_split,
            head_start_seconds=head_start_seconds)
        if graph.model_type is not None and not any(graph.fused.values()):
            warnings.append(f"ONNX Runtime's {graph.model_type} optimizer fused nothing: the "
                            "CPU model is the plain FP32 graph")
        artifacts = Artifacts(cpu_fp32_onnx=fp32_path, cpu_onnx=fp32_path)
        if ctx.plan.precision == "int8" and all(r.passed for r in rows):
            nothing = no_int8_layers_reason(source)
            if nothing is not None:  # nothing INT8 could run: FP32, saying so
                served = ServedInt8(ctx.stage_dir / "int8" / "model.onnx", [], False,
                                    "int8 (none: no weight layer)", (0, 0), {},
                                    failures=[nothing], fp32_reason=nothing,
                                    tried=[{"form": "none", "passed": False,
                                            "failures": [nothing], "status": "failed"}])
            elif has_weight_convs(source):  # ONNX Runtime's static INT8 of Conv/MatMul/Gemm
                served = serve_conv_int8(ctx, work, source, fp32_path, cases)
            else:
                served = serve_int8(ctx, work, source, {
                    "config_model_type": model_type, "num_heads": heads,
                    "hidden_size": hidden, "mask_input": mask}, cases)
            describe_served(metrics, served)
            metrics.smoothquant = recipe.precision_options.int8.smoothquant
            warnings += served.warnings
            if served.search is not None:  # the Q/DQ search ran here: its files too
                artifacts = artifacts.merged(served.search.artifacts)
                search_note = served.search.message
            if ctx.plan.auto_precision and nothing is None:
                chosen = _choose_precision(ctx, fp32_path, served, cases, rows, metrics)
                artifacts = replace(artifacts, cpu_onnx=chosen)
                if chosen == fp32_path:
                    metrics.form = "fp32, fused for ONNX Runtime (--precision auto)"
                elif served.passed:
                    rows += served.rows
            elif served.fp32_reason is not None:  # the INT8 candidate is not served
                if served.path.is_file():
                    artifacts = replace(artifacts, cpu_int8_candidate=served.path)
                warnings.append("; ".join(filter(None, (
                    f"int8: the CPU model is FP32: {served.fp32_reason}",
                    candidate_text(served.candidate)))))
            else:
                artifacts = replace(artifacts, cpu_onnx=served.path)
                rows += served.rows  # what is served is gated
                if served.form == QDQ_FORM:
                    warnings.append("the CPU INT8 forms (ONNX Runtime dynamic quantization) "
                                    "failed their gates (" + "; ".join(served.failures[:2])
                                    + "); the CPU model is the Q/DQ graph, which ONNX Runtime "
                                    "runs mostly in FP32")
        elif ctx.plan.precision == "fp16":
            # ONNX Runtime's CPU kernels are FP32: the CPU model of an FP16 build is FP32
            warnings.append("fp16 build: the CPU model is the fused FP32 graph")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    fused_text = ", ".join(f"{n} {op}" for op, n in metrics.fused_operators.items() if n)
    message = f"{metrics.form}: {fused_text or 'nothing fused'}"
    if metrics.skip_layer_norms_split:
        message += (f" ({metrics.skip_layer_norms_split} SkipLayerNormalization run as Sum + "
                    "LayerNormalization, faster on the CPU)")
    if metrics.int8_fp32_reason and metrics.int8_candidate is None:
        message += f"; FP32 served: {metrics.int8_fp32_reason}"
    elif metrics.int8_weight_layers and metrics.int8_candidate is None:
        kernels = ", ".join(f"{n} {op}" for op, n in metrics.integer_kernels.items())
        message += (f"; int8 {metrics.int8_weight_layers} weight layers (Conv/MatMul/Gemm) on "
                    f"integer kernels ({kernels or 'none'})")
        if metrics.outlier_channels:
            channels = sum(len(c) for c in metrics.outlier_channels.values())
            message += (f", {channels} outlier channels of {len(metrics.outlier_channels)} "
                        "feed-forward layers in FP32")
        if metrics.kept_fp32_layers:
            message += f", {len(metrics.kept_fp32_layers)} layers kept in FP32"
        if metrics.heldout_worst is not None:
            message += f", held-out worst {metrics.heldout_worst:.4f}"
    if metrics.int8_candidate is not None:
        message += "; int8 candidate: " + candidate_text(metrics.int8_candidate)
        if metrics.int8_fp32_reason:
            message += f"; FP32 served: {metrics.int8_fp32_reason}"
    if search_note:
        message += f"; the first CPU form failed, so the Q/DQ search ran: {search_note}"
    if metrics.auto is not None:
        message += f"; auto: {metrics.auto['winner']} ({metrics.auto['reason']})"
    return StageOutcome(artifacts=artifacts, metrics=metrics, verification=rows,
                        warnings=warnings, message=message)


def _choose_precision(ctx: StageContext, fp32_path: Path, served: ServedInt8,
                      cases: list[Case], rows: list[VerificationRow], metrics: CpuModelMetrics
                      ) -> Path:
    """--precision auto: both forms timed at the profile corners, in rotation; the choice
    (``trtpack.precision.cpu.auto_choice``) in the metrics and the message."""
    from trtpack.precision.conversion import worst_metric
    from trtpack.precision.cpu.auto_choice import Candidate, choose, time_candidates
    from trtpack.runtimes.onnxruntime import cpu_session

    fp32_rows = [r for r in rows if r.check == CHECK_FP32]
    held = [r for r in served.rows if r.check == CHECK_INT8_HELDOUT] or served.rows
    candidates = [Candidate("fp32", fp32_path, all(r.passed for r in fp32_rows),
                            worst_metric(fp32_rows)),
                  Candidate("int8", served.path, served.passed, worst_metric(held))]
    ctx.progress("--precision auto: timing fp32 and int8 at every profile corner")
    sessions = {c.name: cpu_session(c.path, spinning=False) for c in candidates}
    time_candidates(candidates, cases, sessions)
    choice = choose(candidates)
    metrics.auto = choice.to_dict()
    return next(c.path for c in candidates if c.name == choice.winner)


def candidate_text(candidate: JsonObject | None) -> str:
    """A convolutional model's INT8 candidate in one clause: its Conv and MatMul/Gemm on
    integer kernels (as ONNX Runtime runs it), its worst sample, its p50 against FP32's."""
    if candidate is None:
        return ""
    text = (f"{candidate['integer_convs']}/{candidate['weight_convs']} Conv and "
            f"{candidate['integer_matmuls']}/{candidate['weight_matmuls']} MatMul/Gemm on "
            "integer kernels")
    worst = candidate.get("worst")
    if isinstance(worst, float):
        text += (f", worst sample {candidate.get('worst_metric')} {worst:.4f} "
                 f"({candidate.get('worst_at')})")
    int8_ms, fp32_ms = candidate.get("p50_ms"), candidate.get("fp32_p50_ms")
    if isinstance(int8_ms, dict) and isinstance(fp32_ms, dict):
        text += ", p50 " + ", ".join(f"{k} {v:.1f} ms (fp32 {fp32_ms.get(k, 0.0):.1f})"
                                     for k, v in int8_ms.items())
    return text


def describe_served(metrics: CpuModelMetrics, served: ServedInt8) -> None:
    """The served INT8 CPU model in the stage's metrics (and the Q/DQ search's, where it
    ran in this stage)."""
    from trtpack.precision.conversion import worst_metric

    quantized, total = served.share
    metrics.int8_form = served.form.removeprefix("int8, ")
    metrics.integer_kernels = served.integer_kernels
    metrics.int8_weight_layers = f"{quantized}/{total}"
    metrics.int8_share = round(quantized / total, 4) if total else 0.0
    metrics.kept_fp32_nodes = served.kept_nodes
    metrics.kept_fp32_layers = served.kept_layers
    metrics.outlier_channels = served.outlier_channels
    metrics.int8_passed = served.passed
    metrics.int8_failures = served.failures
    metrics.int8_forms_tried = served.tried
    metrics.heldout_worst = worst_metric(
        [r for r in served.rows if r.check.endswith("heldout")])
    if served.search is not None:
        metrics.search = served.search.metrics.to_dict()
    metrics.int8_candidate = served.candidate
    metrics.int8_fp32_reason = served.fp32_reason
    if served.passed and served.fp32_reason is None:
        metrics.form = served.form
