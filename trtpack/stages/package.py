"""Package: write the Triton model repository ``OUT/model_repository/<name>/``.

The repository is assembled under a temporary name and renamed into place; the whole build
folder is itself renamed to OUT only when every stage succeeded."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from trtpack.errors import StageError
from trtpack.pipeline import BuildOptions, StageContext, StageOutcome, link_or_copy
from trtpack.serving.config import check_config, model_config, model_io_from_onnx, write_config
from trtpack.stages.export import external_data_path

REPOSITORY = "model_repository"


def fingerprint(options: BuildOptions) -> dict[str, Any]:
    return {"triton": options.recipe.triton.model_dump(), "serve": options.serve,
            "fallback_cpu": options.fallback_cpu}


def served_onnx(ctx: StageContext) -> Path:
    return ctx.artifacts.get("precision_onnx") or ctx.artifact("onnx")


def write_onnx_model(repo: Path, name: str, onnx_path: Path, ctx: StageContext,
                     kind: str = "KIND_CPU") -> Path:
    """An ``onnxruntime_onnx`` model directory, its config derived from the ONNX's real I/O."""
    model_dir = repo / name
    version = model_dir / "1"
    version.mkdir(parents=True)
    link_or_copy(onnx_path, version / "model.onnx")
    data = external_data_path(onnx_path)
    if data.is_file():
        link_or_copy(data, version / data.name)
    io = model_io_from_onnx(version / "model.onnx")
    config = model_config(name, io, ctx.options.profiles, ctx.options.recipe.triton,
                          platform="onnxruntime_onnx", kind=kind)  # type: ignore[arg-type]
    problems = check_config(config, io)
    if problems:
        raise StageError("package", f"config for {name} does not match the model: "
                         + "; ".join(problems))
    write_config(model_dir / "config.pbtxt", config)
    return model_dir


def run(ctx: StageContext) -> StageOutcome:
    name = ctx.options.name
    final = ctx.build_dir / REPOSITORY
    tmp = ctx.build_dir / f".{REPOSITORY}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model_dir = write_onnx_model(tmp, name, served_onnx(ctx), ctx)
    os.replace(tmp, final)
    models = sorted(p.name for p in final.iterdir() if p.is_dir())
    return StageOutcome(
        artifacts={},
        metrics={"models": models, "repository": str(final.relative_to(ctx.build_dir)),
                 "config": str((final / model_dir.name / "config.pbtxt")
                               .relative_to(ctx.build_dir))},
        message=f"{REPOSITORY}/: {', '.join(models)}",
    )
