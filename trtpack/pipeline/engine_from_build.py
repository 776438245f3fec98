"""Convert once, build an engine per GPU family: ``trtpack engine BUILD_DIR --target T``.

A finished ``--no-engine`` build for a GPU target holds everything up to the engine: the
ONNX the engine is built from (the precision stage's, or the simplified FP32), the FP32
references every engine is verified against (``artifacts/verify/fp32_outputs.npz``), the
recipe as built. ``read_finished_build`` reads those stages back, each file checked against
the sha256 its report recorded; ``build_engine_from`` then runs only the engine and package
stages for the new target into a new OUT, with the earlier stages copied from BUILD_DIR.
Every GPU job of a fleet builds from the one folder a CPU job made, so every engine's
provenance names the same ``onnx_sha256`` and ``trtpack merge`` accepts them by
construction (on one host CPU, an FP16 keep/fallback decision near its threshold could not
flip between the jobs' export and conversion runs, since there is one of each).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trtpack.errors import UserInputError
from trtpack.machine.local_targets import check_engine_environment
from trtpack.machine.paths import default_cache_dir
from trtpack.machine.targets import is_gpu_target, resolve_target
from trtpack.onnx_tools.files import sha256_file
from trtpack.options import BuildPlan, FixedPrecision
from trtpack.out_files import ARTIFACTS, REPOSITORY
from trtpack.pipeline.build_folder import load_build_report, load_recipe_of, stage_artifacts
from trtpack.pipeline.runner import FinishedStage, Pipeline
from trtpack.pipeline.stage import STAGES
from trtpack.report import BuildReport, StageResult, VerificationRow
from trtpack.shapes import parse_profiles
from trtpack.sources.recipe import Recipe
from trtpack.stages.artifacts import Artifacts
from trtpack.stages.base import ProgressCallback

ENGINE_STAGE = "engine"
NO_ENGINE = "--no-engine"  # the engine stage's skip reason in such a build's report


@dataclass(frozen=True)
class FinishedBuild:
    """A ``--no-engine`` build folder, read back: what an engine build for another target
    takes from it."""

    root: Path
    report: BuildReport
    recipe: Recipe
    stages: tuple[FinishedStage, ...]  # the stages before the engine that ran, in order
    rows: tuple[VerificationRow, ...]
    serve: str  # "text" when the build wrote a <name>_ensemble
    fallback_cpu: bool


def _artifacts(result: StageResult, root: Path, folder: Path) -> Artifacts:
    """The artifacts a stage handed on (``build_folder.stage_artifacts``), each file checked
    against its recorded sha256."""
    for record in result.artifacts:
        path = root / record.path
        if not path.is_file():
            raise UserInputError(f"{root}: {record.path} is missing (artifact '{record.name}' "
                                 f"of the {result.name} stage)")
        if sha256_file(path) != record.sha256:
            raise UserInputError(f"{root}: {record.path} is not the file its report recorded "
                                 "(sha256 differs): the build folder was changed after it "
                                 "was written")
        if not path.is_relative_to(folder):
            raise UserInputError(f"{root}: artifact {record.path} of the {result.name} stage "
                                 f"is outside {folder.relative_to(root)}")
    return stage_artifacts(result, root)


def read_finished_build(root: Path) -> FinishedBuild:
    """``root`` as a finished ``--no-engine`` build for a GPU target, or ``UserInputError``
    saying why it is not one."""
    if not root.is_dir():
        raise UserInputError(f"'{root}' is not a folder (give the --out of a trtpack build "
                             "--no-engine)")
    report = load_build_report(root)
    if report.status != "ok":
        raise UserInputError(f"'{root}' is a build that did not finish ({report.status})")
    engine = report.stage(ENGINE_STAGE)
    if not is_gpu_target(report.target) or engine is None:
        raise UserInputError(f"'{root}' is a --target cpu build: build the folder for a GPU "
                             "target with --no-engine (the ONNX and references an engine is "
                             "built and verified from)")
    if engine.status != "skipped" or engine.message != NO_ENGINE:
        raise UserInputError(f"'{root}' already has an engine ({report.target}): give the "
                             "folder of a build with --no-engine")
    order = [s.name for s in STAGES]
    before = order[:order.index(ENGINE_STAGE)]
    finished = []
    for result in report.stages:
        if result.name in before and result.status == "ok":
            folder = root / ARTIFACTS / result.name
            log = root / result.log_path if result.log_path else None
            finished.append(FinishedStage(result, folder, _artifacts(result, root, folder), log))
    names = {p.name for p in (root / REPOSITORY).iterdir()} if (root / REPOSITORY).is_dir() \
        else set()
    return FinishedBuild(
        root=root, report=report, recipe=load_recipe_of(root, report.model), stages=tuple(finished),
        rows=tuple(report.verification),
        serve="text" if f"{report.model}_ensemble" in names else "tensor",
        fallback_cpu=f"{report.model}_cpu" in names)


def engine_options(build: FinishedBuild, target: str, out: Path, cache_dir: Path | None = None,
                   use_cache: bool = True) -> BuildPlan:
    """The options of an engine build for ``target`` from ``build``: its recipe, precision,
    profiles and serving, the new target and OUT."""
    resolved = resolve_target(target)
    if not resolved.is_gpu:
        raise UserInputError(f"--target {target} is not a GPU target: an engine is built for a "
                             "GPU family (trtpack targets lists them)")
    if out.resolve() == build.root.resolve():
        raise UserInputError(f"--out {out} is the build folder itself: give a new folder")
    recipe = build.recipe
    profiles = parse_profiles(build.report.profiles, recipe.input_specs())
    return BuildPlan(
        recipe=recipe, profiles=tuple(profiles),
        precision_choice=FixedPrecision.named(build.report.precision),
        target=resolved, out_dir=out, opset=recipe.opset, build_engine=True,
        serve="text" if build.serve == "text" else "tensor", fallback_cpu=build.fallback_cpu,
        cache_dir=cache_dir or default_cache_dir(), use_cache=use_cache)


def build_engine_from(root: Path, target: str, out: Path, *, cache_dir: Path | None = None,
                      use_cache: bool = True, progress: ProgressCallback | None = None,
                      warnings: Sequence[str] = ()) -> BuildReport:
    """Build, verify and package the engine for ``target`` from the ``--no-engine`` build
    ``root``, into ``out`` (a build folder like ``trtpack build``'s). Exit 3 at once when
    this machine cannot build that target's engine."""
    build = read_finished_build(root)
    plan = engine_options(build, target, out, cache_dir, use_cache)
    check_engine_environment(plan.target, plan.recipe.engine.hardware_compatibility)
    pipeline = Pipeline(plan, progress, warnings, finished=build.stages,
                        finished_rows=build.rows)
    return pipeline.run()

