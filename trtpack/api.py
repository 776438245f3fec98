"""Library entry points; the CLI is a thin wrapper over these."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trtpack.errors import UserInputError, require_modules
from trtpack.options import BuildOptions, Fallback, Serve, default_cache_dir
from trtpack.pipeline import build as run_pipeline
from trtpack.recipe import PRECISIONS, Recipe, apply_overrides, resolve_model
from trtpack.report import REPORT, BuildReport
from trtpack.shapes import parse_profiles
from trtpack.stages.base import ProgressCallback
from trtpack.targets import AUTO, CPU, Target, engine_support_problem, resolve_target

# What the stages import (import name → pip package), checked before any work starts so a
# missing package is exit 3 at once, not exit 4 after minutes of export.
CPU_STAGE_MODULES = {
    "torch": "torch", "transformers": "transformers", "onnx": "onnx",
    "onnxruntime": "onnxruntime", "onnxsim": "onnxsim", "polygraphy": "polygraphy",
}
# ModelOpt's ONNX path without its [onnx] extra: modelopt.onnx imports these at import time.
MODELOPT_MODULES = {
    "modelopt": "nvidia-modelopt", "onnxslim": "onnxslim", "onnx_graphsurgeon":
    "onnx-graphsurgeon", "ml_dtypes": "ml_dtypes", "lief": "lief", "cppimport": "cppimport",
}


@dataclass
class BuildRequest:
    """What the user asked for, before resolution (CLI flags map 1:1 onto this)."""

    model: str
    profiles: Sequence[str] = ()
    precision: str | None = None
    target: str = AUTO
    opset: int | None = None
    random_weights: bool = False
    out: Path | None = None
    build_engine: bool = True
    calibration: Path | None = None
    fallback: Fallback = "auto"
    serve: Serve | None = None  # None: the recipe's triton.serve
    fallback_cpu: bool | None = None  # None: the recipe's triton.fallback_cpu
    cache_dir: Path | None = None
    use_cache: bool = True
    portable: str | None = None  # hardware compatibility override, e.g. "ampere+"
    overrides: Sequence[str] = ()  # --set KEY=VALUE on the recipe, e.g. triton.instance_count=2
    timing_cache: Path | None = None  # --timing-cache DIR: a timing-cache folder to share
    task: str | None = None  # --task: the head of a model directory, hub id or ONNX file
    warnings: list[str] = field(default_factory=list)
    calibration_method: str | None = None  # None: the recipe's int8.calibration_method


def resolve_target_for_build(name: str, build_engine: bool,
                             hardware_compatibility: str = "none") -> tuple[Target, list[str]]:
    """The target to build for, and warnings. ``auto`` picks the local GPU's family when a
    GPU and TensorRT are present, else ``cpu`` (with a warning). An explicit GPU target
    never falls back: a missing GPU or TensorRT is an error (exit 3) raised before any work,
    unless ``--no-engine`` was given."""
    from trtpack import gpu

    if name.strip().lower() == AUTO:
        local = gpu.local_target()
        if local is not None and engine_support_problem(local) is None:
            return local, []
        why = (engine_support_problem(local) if local is not None else
               "no NVIDIA GPU with TensorRT found here")
        return CPU, [f"--target auto: {why}; building for 'cpu' (ONNX Runtime); pass "
                     "--target to choose"]
    target = resolve_target(name)
    if target.is_gpu and build_engine:
        problem = engine_support_problem(target)
        if problem is not None:
            raise UserInputError(problem, hint="use --target cpu, or --no-engine for the ONNX "
                                 "models only")
        gpu.check_engine_environment(target, hardware_compatibility)  # type: ignore[arg-type]
    return target, []


def resolve_options(request: BuildRequest) -> tuple[BuildOptions, list[str]]:
    """Validate everything the build needs before any work starts."""
    recipe: Recipe = apply_overrides(resolve_model(request.model, request.task),
                                     list(request.overrides))
    if request.portable is not None:
        if request.portable not in ("none", "ampere+", "same_compute_capability"):
            raise UserInputError(
                f"--portable must be ampere+, same_compute_capability or none, not "
                f"'{request.portable}'")
        recipe = recipe.model_copy(update={"engine": recipe.engine.model_copy(
            update={"hardware_compatibility": request.portable})})
    precision = request.precision or recipe.precision
    if precision not in PRECISIONS:
        raise UserInputError(
            f"unknown precision '{precision}'; choose one of {', '.join(PRECISIONS)}"
        )
    profiles = parse_profiles(list(request.profiles) or recipe.profiles, recipe.input_specs())
    require_modules(CPU_STAGE_MODULES, purpose="trtpack build",
                    install="'trtpack[onnx]' (and torch==2.13.0 on a CPU machine)")
    if precision != "fp32":
        require_modules(MODELOPT_MODULES, purpose=f"--precision {precision} (NVIDIA ModelOpt)",
                        install="'trtpack[modelopt]'")
    if request.opset is not None and not 13 <= request.opset <= 23:
        raise UserInputError(f"--opset {request.opset} is outside 13..23")
    if request.calibration is not None and not request.calibration.is_file():
        raise UserInputError(f"calibration file '{request.calibration}' does not exist")
    if request.calibration is not None and precision != "int8":
        raise UserInputError("--calibration is only used with --precision int8")
    if request.calibration_method is not None:
        from trtpack.precision.calibration import CALIBRATION_METHODS

        if request.calibration_method not in CALIBRATION_METHODS:
            raise UserInputError(
                f"unknown --calibration-method '{request.calibration_method}'; choose one of "
                f"{', '.join(CALIBRATION_METHODS)}")
        if precision != "int8":
            raise UserInputError("--calibration-method is only used with --precision int8")
    if precision == "int8":
        from trtpack.precision.calibration import check_calibration_input

        configured = request.calibration or (
            Path(recipe.precision_options.int8.calibration)
            if recipe.precision_options.int8.calibration else None)
        if configured is not None:
            check_calibration_input(configured, recipe, profiles)
    serve = request.serve or recipe.triton.serve
    fallback_cpu = recipe.triton.fallback_cpu if request.fallback_cpu is None \
        else request.fallback_cpu
    if serve == "text" and recipe.task == "text-generation":
        raise UserInputError(
            f"--serve text is not offered for '{recipe.name}' (text-generation): generating "
            "text needs a decoding loop with a KV cache, which belongs to TensorRT-LLM; "
            "serve its logits with --serve tensor")
    if serve == "text" and not recipe.tokenizer:
        raise UserInputError(
            f"--serve text needs a tokenizer, and recipe '{recipe.name}' has none "
            "(tokenizer: false); use --serve tensor"
        )
    target, warnings = resolve_target_for_build(request.target, request.build_engine,
                                                recipe.engine.hardware_compatibility)
    if fallback_cpu and not target.is_gpu:
        raise UserInputError(
            "--fallback-cpu adds an ONNX Runtime CPU model beside a GPU model; a --target cpu "
            "build already serves the ONNX model with ONNX Runtime on the CPU")
    if request.timing_cache is not None:
        no_engine = None if target.is_gpu and request.build_engine else \
            "--no-engine" if target.is_gpu else f"--target {target.name}"
        warnings += timing_cache_warnings(request.timing_cache, no_engine)
    out = request.out or Path("build") / recipe.name
    if out.exists() and not out.is_dir():
        raise UserInputError(f"--out '{out}' exists and is not a directory")
    options = BuildOptions(
        recipe=recipe, profiles=tuple(profiles), precision=precision, target=target,
        out_dir=out, opset=request.opset or recipe.opset,
        random_weights=request.random_weights, build_engine=request.build_engine,
        calibration=request.calibration, fallback=request.fallback, serve=serve,
        fallback_cpu=fallback_cpu, cache_dir=request.cache_dir or default_cache_dir(),
        use_cache=request.use_cache, timing_cache=_timing_cache_dir(request.timing_cache),
        calibration_method=request.calibration_method,
    )
    return options, warnings


def _timing_cache_dir(path: Path | None) -> Path | None:
    """``--timing-cache DIR``: a folder (created when missing), not a file: it holds one
    cache per compute capability and TensorRT version, so a CI matrix can share it."""
    if path is None:
        return None
    if path.exists() and not path.is_dir():
        raise UserInputError(f"--timing-cache '{path}' is a file; give a folder: it holds one "
                             "timing cache per GPU compute capability and TensorRT version")
    return path.resolve()


def timing_cache_warnings(path: Path, no_engine: str | None) -> list[str]:
    """What ``--timing-cache PATH`` will not do as the user may expect: nothing at all when
    the build makes no engine (``no_engine`` names the option that says so), and a folder,
    not a file, when PATH does not exist and is named like a file (``timing.cache``)."""
    if no_engine is not None:
        return [f"--timing-cache is ignored: {no_engine} builds no TensorRT engine"]
    if not path.exists() and path.suffix:
        return [f"--timing-cache '{path}' will be created as a folder, not a file: it holds "
                "one timing cache per GPU compute capability and TensorRT version"]
    return []


def build(request: BuildRequest, progress: ProgressCallback | None = None) -> BuildReport:
    options, warnings = resolve_options(request)
    report = run_pipeline(options, progress)
    report.warnings[:0] = warnings
    if warnings:
        report.save(options.out_dir / REPORT)
    return report
