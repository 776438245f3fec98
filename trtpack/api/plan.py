"""A build's plan: the request's recipe, precision, profiles and target (``plan_build``), and
what the plan needs from the user's files and this machine (``check_plan``), all checked before
any work starts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import cast

from trtpack.api.recipes import request_recipe
from trtpack.errors import UserInputError, require_modules
from trtpack.machine import local_targets, packages
from trtpack.machine.packages import required_modules
from trtpack.machine.paths import cache_url_from, default_cache_dir
from trtpack.machine.targets import (
    AUTO,
    CPU,
    HardwareCompatibility,
    Target,
    engine_support_problem,
    resolve_target,
)
from trtpack.options import (
    AutoPrecision,
    BuildPlan,
    BuildRequest,
    Fallback,
    FixedPrecision,
    PrecisionChoice,
    Serve,
    compile_check_wanted,
)
from trtpack.shapes import ShapeProfile, check_profile_list, parse_profiles
from trtpack.sources.heads import head_for
from trtpack.sources.recipe import AUTO_PRECISION, CalibrationMethod, Recipe

CPU_FP16_NOTE = (
    "--precision fp16 on --target cpu: serving the FP32 model, the FP16 conversion skipped "
    "(ONNX Runtime's CPU kernels have no FP16 speed-up: an FP16 model there runs slower or "
    "casts back to FP32); to check FP16 for a later GPU build: --target <gpu> --no-engine "
    "(e.g. --target g5 --no-engine)")


def resolve_target_for_build(name: str, build_engine: bool,
                             hardware_compatibility: HardwareCompatibility = "none"
                             ) -> tuple[Target, list[str]]:
    """The target to build for, and warnings. ``auto`` picks the local GPU's family when a
    GPU and TensorRT are present, else ``cpu`` (with a warning). An explicit GPU target
    never falls back: a missing GPU or TensorRT is an error (exit 3) raised before any work,
    unless ``--no-engine`` was given."""
    if name.strip().lower() == AUTO:
        local = local_targets.local_target()
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
        local_targets.check_engine_environment(target, hardware_compatibility)
    return target, []


def precision_choice(request: BuildRequest, recipe: Recipe) -> PrecisionChoice:
    """``--precision`` (or the recipe's) as a fixed precision or ``auto``'s candidates."""
    precision = request.precision or recipe.precision
    if precision == AUTO_PRECISION:
        _refuse_auto_precision_on_gpu(request.target)
        return AutoPrecision()
    return FixedPrecision.named(precision)


def plan_build(request: BuildRequest) -> tuple[BuildPlan, list[str]]:
    """The plan of ``request`` (its choices checked and in lower case:
    ``options.check_choices``), and warnings about it."""
    fallback = cast(Fallback, request.fallback)
    cache_dir = request.cache_dir or default_cache_dir()
    recipe, source_files = request_recipe(request, cache_dir)
    choice = precision_choice(request, recipe)
    profiles = parse_profiles(list(request.profiles) or recipe.profiles, recipe.input_specs())
    profile_notes = check_profile_list(list(request.profiles), profiles) \
        if request.profiles else []
    require_packages(choice)
    if request.opset is not None and not 13 <= request.opset <= 23:
        raise UserInputError(f"--opset {request.opset} is outside 13..23")
    if request.calibration is not None and choice.built != "int8":
        raise UserInputError("--calibration is only used with --precision int8")
    method = cast(CalibrationMethod | None, request.calibration_method)  # check_choices read it
    if method is not None and choice.built != "int8":
        raise UserInputError("--calibration-method is only used with --precision int8")
    if not 0.0 <= request.min_int8_share <= 1.0:
        raise UserInputError(f"--min-int8-share {request.min_int8_share} is outside 0..1")
    serve = cast(Serve, request.serve or recipe.triton.serve)
    fallback_cpu = recipe.triton.fallback_cpu if request.fallback_cpu is None \
        else request.fallback_cpu
    check_serve(serve, recipe)
    target, warnings = resolve_target_for_build(request.target, request.build_engine,
                                                recipe.engine.hardware_compatibility)
    warnings += profile_notes
    if isinstance(choice, AutoPrecision):
        _refuse_auto_precision_on_gpu(target.name)  # --target auto, resolved
    if target.is_gpu:
        from trtpack.engine.parser_opsets import opset_warning

        opset_note = opset_warning(request.opset or recipe.opset, packages.tensorrt_version())
        warnings += [opset_note] if opset_note else []
        warnings += check_triton_profiles(profiles, recipe, serve)
    elif choice == FixedPrecision("fp16"):
        choice = FixedPrecision("fp32")
        warnings.append(CPU_FP16_NOTE)
    if fallback_cpu and not target.is_gpu:
        raise UserInputError(
            "--fallback-cpu adds an ONNX Runtime CPU model beside a GPU model; a --target cpu "
            "build already serves the ONNX model with ONNX Runtime on the CPU")
    if request.timing_cache is not None:
        no_engine = None if target.is_gpu and request.build_engine else \
            "--no-engine" if target.is_gpu else f"--target {target.name}"
        warnings += timing_cache_warnings(request.timing_cache, no_engine)
    cache_url = cache_url_from(request.cache_url)
    if cache_url is not None and request.use_cache:
        require_modules({"boto3": "boto3"}, purpose="--cache-url",
                        install="pip install 'trtpack[remote-cache]'")
    out = request.out or Path("build") / recipe.name
    if out.exists() and not out.is_dir():
        raise UserInputError(f"--out '{out}' exists and is not a directory")
    plan = BuildPlan(
        recipe=recipe, profiles=tuple(profiles), precision_choice=choice, target=target,
        out_dir=out, opset=request.opset or recipe.opset,
        random_weights=request.random_weights or recipe.source.random_weights,
        build_engine=request.build_engine,
        compile_check=compile_check_wanted(request.compile_check),
        calibration=request.calibration or (request.sample_inputs if choice.built == "int8"
                                            else None),
        fallback=fallback, serve=serve, sample_inputs=request.sample_inputs,
        fallback_cpu=fallback_cpu, cache_dir=cache_dir, source_files=source_files,
        use_cache=request.use_cache, cache_url=cache_url,
        timing_cache=_timing_cache_dir(request.timing_cache),
        calibration_method=method, min_int8_share=request.min_int8_share, force=request.force)
    return plan, warnings


def check_serve(serve: str, recipe: Recipe) -> None:
    """``--serve text`` needs a tokenizer, and a head that offers it."""
    head = head_for(recipe.task)
    if serve == "text" and head is not None and head.serve_text_refusal is not None:
        raise UserInputError(f"--serve text is not offered for '{recipe.name}' "
                             f"({recipe.task}): {head.serve_text_refusal}")
    if serve == "text" and not recipe.tokenizer:
        raise UserInputError(
            f"--serve text needs a tokenizer, and recipe '{recipe.name}' has none "
            "(tokenizer: false)",
            hint="give one with --tokenizer PATH (a folder with tokenizer.json or vocab.txt), "
            "or use --serve tensor")


def require_packages(choice: PrecisionChoice) -> None:
    """The packages a build of ``choice`` needs (as asked: --precision fp16 on a CPU target
    too): a missing one is exit 3 at once, not exit 4 later."""
    require_modules(required_modules("build"), purpose="trtpack build",
                    install="'trtpack[onnx]' (and torch==2.13.0 on a CPU machine)")
    if choice.built != "fp32":
        require_modules(required_modules("modelopt"),
                        purpose=f"--precision {choice.built} (NVIDIA ModelOpt)",
                        install="'trtpack[modelopt]'")


def check_plan(plan: BuildPlan) -> None:
    """What the plan needs from the user's files and this machine, checked before any work:
    the sample inputs and the calibration file (exit 2), the hub weights (offline: exit 3 now,
    not after retries)."""
    recipe = plan.recipe
    if plan.sample_inputs is not None:
        from trtpack.sources.architectures import vocab_size
        from trtpack.verify.sample_files import read_sample_inputs

        vocab = recipe.vocab_size or (vocab_size(recipe.config) if recipe.config else None)
        read_sample_inputs(plan.sample_inputs, recipe, vocab)
    if plan.precision == "int8":  # --calibration without int8 was refused by plan_build
        from trtpack.precision.calibration.data import calibration_path
        from trtpack.precision.calibration.files import check_calibration_input

        configured = calibration_path(plan)
        if configured is not None:  # its existence, then its contents, read once
            check_calibration_input(configured, recipe, list(plan.profiles))
    if not plan.random_weights and recipe.source.hf_id:
        from trtpack.pytorch.models import require_hub_weights

        require_hub_weights(recipe.source.hf_id)


def _refuse_auto_precision_on_gpu(target_name: str) -> None:
    """``--precision auto`` times fp32 against int8 on ONNX Runtime: a CPU build's choice.
    A GPU target is refused on every machine, also ``--target auto`` once it resolved to a
    GPU (an int8 engine would otherwise be built untimed and called the choice)."""
    if target_name != AUTO and resolve_target(target_name).is_gpu:
        raise UserInputError(
            f"--precision auto chooses between fp32 and int8 on ONNX Runtime for --target cpu "
            f"only; for --target {target_name} choose --precision fp32, fp16 or int8")


def check_triton_profiles(profiles: Sequence[ShapeProfile], recipe: Recipe,
                          serve: str) -> list[str]:
    """Refuse, before any work, profile sets Triton's TensorRT backend cannot serve
    (``serving.triton_rules``): a batch from 1 to the largest max batch that no profile
    holds (for a batched model; the dynamic batcher forms them all), and for
    ``--serve text`` no sequence length served at every batch. Warn when some sequence
    lengths are served only at some batches (clients must pad those; --serve text does)."""
    from trtpack.serving.triton_rules import (
        batch_coverage_problem,
        no_served_length_problem,
        partly_served_lengths_warning,
    )

    batched = all(spec.has_dynamic_batch for spec in recipe.input_specs())
    problem = batch_coverage_problem(profiles, batched) if profiles and all(
        p.shapes and len(next(iter(p.shapes.values())).min) > 0 for p in profiles) else None
    if problem is not None:
        raise UserInputError(problem)
    ids = recipe.input_name("token_ids")
    if ids is None or not all(ids in p.shapes and len(p.shapes[ids].min) >= 2
                              for p in profiles):
        return []  # no [batch, sequence] token input: nothing more to check
    if serve == "text":
        problem = no_served_length_problem(profiles, ids)
        if problem is not None:
            raise UserInputError(problem)
        return []
    warning = partly_served_lengths_warning(profiles, ids)
    return [warning] if warning else []


def _timing_cache_dir(path: Path | None) -> Path | None:
    """``--timing-cache DIR``: a folder (created when missing), not a file: it holds one
    cache per GPU (model and compute capability) and TensorRT version, so a CI matrix can
    share it."""
    if path is None:
        return None
    if path.exists() and not path.is_dir():
        raise UserInputError(f"--timing-cache '{path}' is a file; give a folder: it holds one "
                             "timing cache per GPU and TensorRT version")
    return path.resolve()


def timing_cache_warnings(path: Path, no_engine: str | None) -> list[str]:
    """What ``--timing-cache PATH`` will not do as the user may expect: nothing at all when
    the build makes no engine (``no_engine`` names the option that says so), and a folder,
    not a file, when PATH does not exist and is named like a file (``timing.cache``)."""
    if no_engine is not None:
        return [f"--timing-cache is ignored: {no_engine} builds no TensorRT engine"]
    if not path.exists() and path.suffix:
        return [f"--timing-cache '{path}' will be created as a folder, not a file: it holds "
                "one timing cache per GPU and TensorRT version"]
    return []
