"""The runtimes ``trtpack bench`` times, each prepared once and then for one case's inputs:
ONNX Runtime, the TensorRT engine, PyTorch eager."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, cast

from trtpack.bench.timing import ProgressFn, Runner
from trtpack.cases import Case
from trtpack.errors import MissingEnvironmentError, UserInputError, require_modules
from trtpack.machine.targets import HardwareCompatibility, Target, local_gpu_target, resolve_target
from trtpack.pipeline.build_folder import BuildFolder, load_build_recipe
from trtpack.timing import RunOnce

if TYPE_CHECKING:
    from trtpack.engine.provenance import EngineProvenance


def call_with(func: Callable[..., object], *args: object) -> RunOnce:
    return lambda: func(*args)


def onnxruntime_runner(model: Path, threads: int) -> Runner:
    from trtpack.runtimes.onnxruntime import cpu_session

    # no spinning: the runtimes take turns on the same cores, and a spinning idle pool of one
    # would slow the next
    session = cpu_session(model, threads, inter_op_threads=1, spinning=False)
    names = {i.name for i in session.get_inputs()}

    def prepare(case: Case) -> RunOnce:
        return call_with(session.run, None, {k: v for k, v in case.inputs.items() if k in names})

    return prepare


def tensorrt_runner(engine_path: Path, profiles: set[int], stack: ExitStack) -> Runner:
    """NOT RUN on any GPU yet (no GPU or TensorRT where this was written): the engine through
    the runner the engine stage verifies it with, one execution context per profile."""
    from trtpack.runtimes import tensorrt as tensorrt_api

    engine = tensorrt_api.load_engine(engine_path)
    infers = {p: stack.enter_context(tensorrt_api.engine_runner(engine, p)) for p in profiles}

    def prepare(case: Case) -> RunOnce:
        infer = infers[case.profile]
        return call_with(infer, infer.feed(case.inputs))

    return prepare


def pytorch_skip_reason(build: BuildFolder) -> str | None:
    """Why PyTorch eager cannot be the baseline of this build (None when it can)."""
    export = build.report.stage("export")
    if export is None or export.status != "ok":
        return "the model did not come from PyTorch (no export stage): no eager baseline"
    try:
        require_modules({"torch": "torch", "transformers": "transformers"},
                        purpose="the PyTorch baseline", install="'trtpack[onnx]'")
    except MissingEnvironmentError as e:
        return str(e)
    return None


def pytorch_runner(build: BuildFolder, threads: int, device: str, stack: ExitStack,
                   progress: ProgressFn) -> Runner:
    """The recipe's model in PyTorch eager, loaded as the export stage loads it."""
    import torch

    from trtpack.pytorch.models import load_model
    from trtpack.stages.export import output_selector

    recipe = load_build_recipe(build)
    export = build.report.stage("export")
    random_weights = export is not None and export.metrics.get("weights") == "random"
    progress("loading the PyTorch model" + (" (random weights)" if random_weights else ""))
    torch.set_num_threads(threads)
    loaded = load_model(recipe, random_weights=random_weights)
    wrapper = output_selector(loaded.module, recipe).to(device)
    names = [i.name for i in recipe.inputs]
    stack.enter_context(torch.inference_mode())
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def prepare(case: Case) -> RunOnce:
        args = [torch.from_numpy(case.inputs[n]).to(device) for n in names]

        def run_once() -> None:
            wrapper(*args)
            sync()

        return run_once

    return prepare


def engine_provenance(build: BuildFolder) -> EngineProvenance | None:
    """The provenance beside the build's engine (None when it has none)."""
    from trtpack.engine.provenance import EngineProvenance, provenance_path

    prov_file = provenance_path(build.served_model)
    return EngineProvenance.load(prov_file) if prov_file.is_file() else None


def engine_target(build: BuildFolder) -> tuple[Target, HardwareCompatibility]:
    """The target an engine build was for and its hardware compatibility: a family of the
    table, or (``--target auto`` on a GPU outside the table, recorded as ``smXY``) one named
    after the GPU that built it, from the engine's provenance."""
    prov = engine_provenance(build)
    level = cast(HardwareCompatibility, prov.hardware_compatibility if prov else "none")
    try:
        return resolve_target(build.report.target), level
    except UserInputError:
        if prov is None:
            raise
        return local_gpu_target(prov.gpu_name, prov.cc), level


def check_runtime(build: BuildFolder) -> None:
    """``MissingEnvironmentError`` (exit 3) when the served model's runtime is not here:
    for an engine, a GPU it runs on (its hardware compatibility counted) and TensorRT."""
    if build.is_engine:
        from trtpack.engine.provenance import runs_here
        from trtpack.machine.local_targets import engine_environment

        target, level = engine_target(build)
        env = engine_environment(target, level)
        problems = list(env.problems)
        prov = engine_provenance(build)
        if prov is not None and env.gpu is not None and env.tensorrt_version is not None:
            problems += runs_here(prov, env.gpu.name, env.gpu.compute_capability,
                                  env.tensorrt_version)[1]
        if problems:
            raise MissingEnvironmentError(
                f"cannot bench the TensorRT engine of '{build.root}' here: "
                + "; ".join(dict.fromkeys(problems)),
                hint="run trtpack bench on a GPU of the target's family with TensorRT (the "
                "NGC container)")
    require_modules({"onnxruntime": "onnxruntime"}, purpose="trtpack bench",
                    install="'trtpack[onnx]'")
