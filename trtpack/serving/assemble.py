"""One Triton model repository for a fleet: every model's build in one ``model_repository/``
(``trtpack fleet build``, ``trtpack fleet assemble``).

    OUT/model_repository/<model>/...       each build's models (its engine or ONNX model,
                                           its tokenizer, ensembles, <name>_cpu)
    OUT/assemble.json                      the build folders and the models each gave

The build folders of one model (the same ``report.json`` model name) for several GPU
families are merged first, by ``merge``'s rule (``serving.merge``: one engine per compute
capability through ``cc_model_filenames``, two GPU models of one compute capability only
where both engines were built with ``same_compute_capability``); a model with one build
(a CPU-only build, a ``--no-engine`` build, one GPU family) is taken as it is. Two models
whose repositories hold a model folder of the same name are refused (Triton serves one model
per name), as is one model built both for the CPU and for a GPU. Everything is checked
before anything is written; the repository is written under a temporary name and renamed
into place."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trtpack.errors import UserInputError
from trtpack.machine.targets import is_gpu_target
from trtpack.out_files import REPOSITORY, made_in_place_of
from trtpack.report import REPORT
from trtpack.serving.config import CONFIG_FILE, ENGINE_PLATFORM, read_config
from trtpack.serving.engine_builds import build_error
from trtpack.serving.merge import merge_builds

ASSEMBLE_REPORT = "assemble.json"


@dataclass(frozen=True)
class BuildFolder:
    """A ``trtpack build`` output folder: its model's name, target, and whether its model is
    served by a TensorRT engine."""

    folder: Path
    model: str
    target: str
    engine: bool


@dataclass(frozen=True)
class AssembledModel:
    model: str  # the build's model (report.json's)
    builds: tuple[Path, ...]
    served: tuple[str, ...]  # the model folders it put in the repository
    merged: bool  # its GPU builds' engines merged by compute capability


@dataclass(frozen=True)
class AssembleResult:
    out_dir: Path
    models: tuple[AssembledModel, ...]

    @property
    def repository(self) -> Path:
        return self.out_dir / REPOSITORY

    @property
    def served(self) -> list[str]:
        return sorted(m for a in self.models for m in a.served)


def read_build_folder(folder: Path) -> BuildFolder:
    """A build folder's model and target (``report.json``) and its repository, checked."""
    if not folder.is_dir():
        raise build_error(folder, "is not a folder")
    try:
        report = json.loads((folder / REPORT).read_text(encoding="utf-8"))
        model, target = str(report["model"]), str(report["target"])
    except FileNotFoundError:
        raise build_error(folder, f"is not a trtpack build folder (no {REPORT})") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise build_error(folder, f"{REPORT} is not a trtpack build report ({e})") from None
    config_file = folder / REPOSITORY / model / CONFIG_FILE
    if not config_file.is_file():
        raise build_error(folder, f"has no {REPOSITORY}/{model}/{CONFIG_FILE}")
    engine = read_config(config_file).platform == ENGINE_PLATFORM
    return BuildFolder(folder, model, target, engine)


def _served_models(repository: Path) -> list[str]:
    return sorted(p.parent.name for p in repository.glob(f"*/{CONFIG_FILE}"))


def _groups(builds: Sequence[BuildFolder]) -> dict[str, list[BuildFolder]]:
    groups: dict[str, list[BuildFolder]] = {}
    for build in builds:
        groups.setdefault(build.model, []).append(build)
    for model, group in groups.items():
        if len(group) == 1:
            continue
        cpu = [b for b in group if not is_gpu_target(b.target) or not b.engine]
        if cpu:
            raise UserInputError(
                f"model '{model}' has {len(group)} build folders and {cpu[0].folder} is not a "
                "GPU engine build: only the engine builds of one model for several GPU "
                "families are merged; give one build folder for a CPU or --no-engine build")
    return groups


def assemble_builds(build_dirs: Sequence[Path], out: Path) -> AssembleResult:
    """Every build of ``build_dirs`` in one model repository under ``out`` (new or empty);
    the build folders are left as they are."""
    if not build_dirs:
        raise UserInputError("assemble needs one or more build folders")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserInputError(f"--out {out} exists and is not empty")
    builds = [read_build_folder(Path(d)) for d in build_dirs]
    for build in builds:
        if out.resolve().is_relative_to(build.folder.resolve()):
            raise UserInputError(f"--out {out} is inside the build folder {build.folder}")
    groups = _groups(builds)
    owner: dict[str, Path] = {}
    for group in groups.values():
        for name in _served_models(group[0].folder / REPOSITORY):
            if name in owner:
                raise build_error(group[0].folder, f"serves a model named '{name}', as "
                                  f"{owner[name]} does: Triton serves one model per name; "
                                  "build them from sources of different names")
            owner[name] = group[0].folder
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.assembling-", dir=out.parent))
    with made_in_place_of(tmp, out):  # out is empty or absent (checked above)
        repo = tmp / REPOSITORY
        repo.mkdir()
        assembled = []
        for model, group in groups.items():
            source = group[0].folder / REPOSITORY
            merged = len(group) > 1
            if merged:  # merge's own checks and layout, in a folder of its own
                merge_out = tmp / ".merging" / model
                merge_builds([b.folder for b in group], merge_out)
                source = merge_out / REPOSITORY
            served = _served_models(source)
            for name in served:
                # copies: onnx refuses external data files with several hard links
                shutil.copytree(source / name, repo / name)
            assembled.append(AssembledModel(model, tuple(b.folder for b in group),
                                            tuple(served), merged))
        shutil.rmtree(tmp / ".merging", ignore_errors=True)
        for name in _served_models(repo):  # every config parses back with Triton's schema
            read_config(repo / name / CONFIG_FILE)
        result = AssembleResult(out, tuple(assembled))
        (tmp / ASSEMBLE_REPORT).write_text(json.dumps({"models": [{
            "model": a.model, "builds": [str(b.resolve()) for b in a.builds],
            "served": list(a.served), "merged": a.merged} for a in assembled]}, indent=2)
            + "\n", encoding="utf-8")
    return result
