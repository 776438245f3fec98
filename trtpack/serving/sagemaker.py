"""Model archives for SageMaker multi-model endpoints (Triton containers).

How SageMaker's Triton loads one archive (``docker/sagemaker/serve`` and
``src/sagemaker_server.cc`` in triton-inference-server/server): the archive is extracted to
``/opt/ml/models/<hash>/model/`` and registered as a model repository of its own; each
top-level folder is a model (``<model>/config.pbtxt``, ``<model>/1/...``). With one folder
that model is loaded; with several, the folder whose config says ``platform: "ensemble"`` is
loaded (with the members it names), so an archive holds at most one ensemble. The loaded model
answers under the archive's name (the ``TargetModel`` of InvokeEndpoint, e.g.
``minilm_ensemble.tar.gz``).

So: one ``<model>.tar.gz`` per model a client calls (the model, its CPU fallback, each
ensemble with its members packed beside it). Python-backend helpers (tokenizer,
post-processing) travel only inside their ensemble's archive. Archives are reproducible: sorted
entries, no owners, fixed times.
"""

from __future__ import annotations

from pathlib import Path

from trtpack.errors import UserInputError
from trtpack.out_files import SAGEMAKER, make_folder, record_files
from trtpack.serving.sagemaker_archives import (
    SageMakerArchive,
    SageMakerPackage,
    archive_contents,
    find_model_repository,
    model_configs,
    write_archive,
)
from trtpack.serving.sagemaker_note import sagemaker_note

NOTE = "SAGEMAKER.md"


def package_sagemaker(path: Path, dest: Path | None = None, *,
                      compresslevel: int = 1) -> SageMakerPackage:
    """Write ``<model>.tar.gz`` archives and ``SAGEMAKER.md`` for a build output folder or a
    model repository. ``dest`` defaults to ``<path>/sagemaker``; it must not be inside the
    repository (Triton would take it for a model folder)."""
    repository = find_model_repository(path)
    dest = dest or path / SAGEMAKER
    if dest.resolve().is_relative_to(repository.resolve()):
        raise UserInputError(f"--dest {dest} is inside the model repository {repository}")
    configs = model_configs(repository)
    make_folder(dest, "--dest")
    archives = []
    for entry, models in archive_contents(repository):
        archive = dest / f"{entry}.tar.gz"
        write_archive(repository, models, archive, compresslevel)
        archives.append(SageMakerArchive(archive, entry, tuple(models)))
    note = dest / NOTE
    package = SageMakerPackage(dest, repository, tuple(archives), note)
    note.write_text(sagemaker_note(package, configs), encoding="utf-8")
    # in a build folder: a rebuild replaces these with the rest of trtpack's files
    record_files(path, [a.path for a in archives] + [note])
    return package


def package(path: Path, dest: Path | None = None) -> SageMakerPackage:
    """``trtpack package --format sagemaker`` (``trtpack.serving.package_formats``)."""
    return package_sagemaker(path, dest)
