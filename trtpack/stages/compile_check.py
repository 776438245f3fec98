"""Compile check: the engine stage's network and builder config compiled by TensorRT for RTX
on this machine's CPU, for a GPU build whose engine no local TensorRT builds (``--no-engine``).

The same ONNX the engine stage would build from (``Artifacts.served_model``), the same
profiles, the same strongly typed network and builder settings
(``engine.builder.builder_settings``, polygraphy's loaders through
``runtimes.tensorrt.engine_loaders``), minus what TensorRT-RTX lacks
(``engine.tensorrt_rtx.RTX_DIFFERENCES``, the one table), for the target's compute
capability (or a stand-in, recorded). Its process has ``POLYGRAPHY_USE_TENSORRT_RTX=1`` from
its start (``Stage.environment``), so polygraphy's loaders drive ``tensorrt_rtx``. Nothing
needing a GPU runs (no environment check, no engine load, no inference): this proves what
NVIDIA's parser and builder accept — the graph, its types, every profile — not numerics.
The plan is not kept: its bytes and sha256 are recorded (``compile_check.json``).

A refusal is a ``StageError`` (exit 4) naming the node, its op type and the parser's or
builder's own words; a refusal a row of the TensorRT-RTX-only table explains is a warning,
recorded as "not checked: <row>".
"""

from __future__ import annotations

import json
import resource
import time
from dataclasses import asdict, dataclass

from trtpack.engine import builder
from trtpack.engine.tensorrt_rtx import (
    BUILDER,
    CompiledFor,
    RtxSettings,
    compiled_for,
    refusal_difference,
    wording,
)
from trtpack.errors import StageError
from trtpack.machine.packages import parse_version, tensorrt_rtx_version
from trtpack.model_io import model_io_from_onnx
from trtpack.options import BuildPlan
from trtpack.report import JsonObject
from trtpack.stages.base import StageContext, StageMetrics, StageOutcome

RECORD = "compile_check.json"


@dataclass
class CompileCheckMetrics(StageMetrics):
    builder: str  # "TensorRT-RTX"
    builder_version: str
    parsed: bool  # the ONNX parser accepted the graph
    built: bool  # build_serialized_network returned an engine
    compiled_for: str  # the compute capability compiled for ("8.6")
    target_compute_capability: str
    stand_in: bool  # compiled_for is not the target's architecture
    # the parsed network's inputs, read from the network: name -> {"dtype", "shape"}
    inputs: dict[str, JsonObject]
    # per optimization profile, read back from the builder's: input -> [min, opt, max]
    profiles: list[dict[str, list[list[int]]]]
    engine_bytes: int | None
    engine_sha256: str | None
    parse_seconds: float
    build_seconds: float  # build_serialized_network alone
    seconds: float  # parse, config and build
    peak_memory_mb: float  # this stage's process, its peak resident memory
    left_out: list[str]  # settings of this build TensorRT-RTX lacks (the table's rows)
    not_checked: str | None = None  # a refusal the table's row explains
    wording: str = ""


def fingerprint(plan: BuildPlan) -> JsonObject:
    target = compiled_for(plan.target)
    return {
        "target": plan.target.name,
        "compiled_for": target.compiled_sm,
        "profiles": [p.to_dict() for p in plan.profiles],
        "precision": plan.precision,
        "engine": plan.recipe.engine.model_dump(),
        "tensorrt_rtx": tensorrt_rtx_version(),  # only this stage's key holds it
    }


def _peak_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def run(ctx: StageContext) -> StageOutcome:
    from trtpack.runtimes import tensorrt as tensorrt_api
    from trtpack.runtimes.tensorrt_compile import CompileRefused, compile_engine

    o = ctx.plan
    onnx = ctx.artifacts.served_model(gpu=True)
    onnx_io = model_io_from_onnx(onnx)
    profiles = builder.tensorrt_profiles(o.profiles, [t.name for t in onnx_io.inputs])
    version = tensorrt_api.tensorrt_version()
    if not tensorrt_api.tensorrt_module().__name__.startswith("tensorrt_rtx"):
        raise StageError(ctx.stage, "polygraphy did not pick TensorRT-RTX in this process "
                                    "(POLYGRAPHY_USE_TENSORRT_RTX must be set before it is "
                                    "imported)")
    # the engine stage's settings (strongly typed, as for TensorRT 10); those TensorRT-RTX
    # lacks are left out (RTX_DIFFERENCES)
    settings = RtxSettings(builder.builder_settings(o.recipe.engine, parse_version(version)))
    target: CompiledFor = compiled_for(o.target)
    dropped = settings.left_out()
    ctx.progress(f"compiling with {BUILDER} {version} on CPU for {target.describe()}, "
                 f"{len(profiles)} profile(s)")
    started = time.perf_counter()
    try:
        compiled = compile_engine(onnx, profiles, settings, target.enum_member, ctx.log)
    except CompileRefused as refused:
        row = refusal_difference(refused.message)
        if row is None:
            raise StageError(ctx.stage, f"{BUILDER} {version}: {refused.line()}") from None
        return _not_checked(ctx, version, target, dropped, row.line(), refused.line(),
                            time.perf_counter() - started)
    seconds = time.perf_counter() - started
    metrics = CompileCheckMetrics(
        builder=BUILDER, builder_version=compiled.builder_version, parsed=True, built=True,
        compiled_for=target.compiled_sm, target_compute_capability=target.target_sm,
        stand_in=target.stand_in,
        inputs={t.name: {"dtype": t.dtype, "shape": list(t.shape)} for t in compiled.inputs},
        profiles=[{name: [list(corner) for corner in corners]
                   for name, corners in profile.items()} for profile in compiled.profiles],
        engine_bytes=compiled.engine_bytes, engine_sha256=compiled.engine_sha256,
        parse_seconds=round(compiled.parse_seconds, 3),
        build_seconds=round(compiled.build_seconds, 3), seconds=round(seconds, 3),
        peak_memory_mb=_peak_mb(), left_out=dropped, wording=wording(compiled.builder_version))
    _write_record(ctx, metrics)
    warnings = [f"compile check: {target.describe()}"] if target.stand_in else []
    return StageOutcome(
        metrics=metrics, warnings=warnings,
        message=(f"{metrics.wording}: {len(compiled.inputs)} input(s), "
                 f"{len(compiled.profiles)} profile(s), sm {target.compiled_sm}"
                 f"{' (stand-in)' if target.stand_in else ''}, "
                 f"{compiled.engine_bytes / 2**20:.1f} MB engine in "
                 f"{compiled.build_seconds:.1f} s"))


def _write_record(ctx: StageContext, metrics: CompileCheckMetrics) -> None:
    (ctx.stage_dir / RECORD).write_text(json.dumps(asdict(metrics), indent=1) + "\n",
                                        encoding="utf-8")


def _not_checked(ctx: StageContext, version: str, target: CompiledFor, dropped: list[str],
                 row: str, refusal: str, seconds: float) -> StageOutcome:
    """A refusal a row of the TensorRT-RTX-only table explains: a warning, not a failure."""
    metrics = CompileCheckMetrics(
        builder=BUILDER, builder_version=version, parsed=not refusal.startswith("parse"),
        built=False, compiled_for=target.compiled_sm,
        target_compute_capability=target.target_sm, stand_in=target.stand_in, inputs={},
        profiles=[], engine_bytes=None, engine_sha256=None, parse_seconds=0.0,
        build_seconds=0.0, seconds=round(seconds, 3), peak_memory_mb=_peak_mb(),
        left_out=dropped, not_checked=row, wording=wording(version))
    _write_record(ctx, metrics)
    return StageOutcome(metrics=metrics,
                        warnings=[f"compile check: not checked: {row}; {BUILDER}: {refusal}"],
                        message=f"not checked: {row}")

