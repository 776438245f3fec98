"""Package: write the Triton model repository ``OUT/model_repository/`` (and ``OUT/tuning/``).

The served model is the one ``Artifacts.served_model`` chooses (``trtpack.stages.artifacts``).
``--serve text`` adds the tokenizer / post-processing / ensemble models and ``--fallback-cpu``
an ONNX Runtime CPU model (see ``trtpack.serving.repository``). The
repository is assembled under a temporary name and renamed into place; the whole build
folder is itself renamed to OUT only when every stage succeeded."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.options import BuildPlan
from trtpack.out_files import REPOSITORY, TUNING
from trtpack.report import JsonObject
from trtpack.stages.base import StageContext, StageMetrics, StageOutcome

if TYPE_CHECKING:
    from trtpack.cases import Case
    from trtpack.serving.layout import ModelRepository

SERVED = "served"  # PackageMetrics' field naming what is served: the readers' key


@dataclass
class PackageMetrics(StageMetrics):
    models: dict[str, str]  # model name -> Triton backend or platform
    repository: str  # the repository folder's name inside OUT
    tuning: list[str]  # perf_analyzer / Model Analyzer files, relative to OUT
    # what is served: per model with a model file (the model, --fallback-cpu's CPU model) its
    # role, its file relative to OUT and its runtime (the Triton platform)
    served: list[dict[str, str]] = field(default_factory=list)


def fingerprint(plan: BuildPlan) -> JsonObject:
    return {"triton": plan.recipe.triton.model_dump(), "serve": plan.serve,
            "fallback_cpu": plan.fallback_cpu}


def run(ctx: StageContext) -> StageOutcome:
    from trtpack.serving.repository import RepositoryPlan, write_model_repository

    plan = ctx.plan
    final, tuning = ctx.build_dir / REPOSITORY, ctx.build_dir / TUNING
    tmp, tmp_tuning = (ctx.build_dir / f".{REPOSITORY}.tmp", ctx.build_dir / f".{TUNING}.tmp")
    for folder in (tmp, tmp_tuning):
        shutil.rmtree(folder, ignore_errors=True)
    ctx.progress("writing the Triton model repository")
    repo = write_model_repository(tmp, RepositoryPlan(
        recipe=plan.recipe,
        profiles=plan.profiles,
        model_path=ctx.artifacts.served_model(plan.target.is_gpu),
        gpu=plan.target.is_gpu,
        serve=plan.serve,
        fallback_cpu=plan.fallback_cpu,
        fallback_onnx=ctx.needs(ctx.artifacts.cpu_fallback_model(), "onnx")
        if plan.fallback_cpu else None,
        tokenizer_dir=ctx.artifacts.tokenizer,
        model_config_json=ctx.artifacts.model_config,
        tuning_dir=tmp_tuning,
        repository_ref=f"../{REPOSITORY}",  # tuning files name the final folder
        tuning_cases=_verified_inputs(ctx),
    ))
    os.replace(tmp, final)
    if tmp_tuning.exists():
        os.replace(tmp_tuning, tuning)
    models = [m.name for m in repo.models]
    return StageOutcome(
        metrics=PackageMetrics(
            models={m.name: m.backend for m in repo.models}, repository=REPOSITORY,
            # relative to OUT (the folder being built here is renamed to OUT at the end)
            tuning=[str(Path(TUNING) / p.relative_to(tmp_tuning)) for p in repo.tuning_files],
            served=served_records(repo, tmp, Path(REPOSITORY))),
        warnings=list(repo.warnings),
        message=f"{REPOSITORY}/: {', '.join(models)}",
    )


def served_records(repo: ModelRepository, written: Path, final: Path) -> list[dict[str, str]]:
    """PackageMetrics.served: each model of ``repo`` (written under ``written``) that has a
    model file, by role, its file as a path under ``final`` (relative to OUT)."""
    return [{"role": m.role, "model": m.name, "runtime": m.backend,
             "file": str(final / m.model_file.relative_to(written))}
            for m in repo.models if m.model_file is not None]


def _verified_inputs(ctx: StageContext) -> list[Case]:
    """The cases the build was verified on: perf_analyzer's input data, beside the tuning
    scripts (what ``trtpack bench --served`` sends)."""
    from trtpack.cases import load_cases

    reference = ctx.artifacts.reference
    return [] if reference is None else load_cases(reference)
