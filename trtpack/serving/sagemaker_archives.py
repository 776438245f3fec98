"""SageMaker's model archives: which model folders each holds, and writing them.

One ``<model>.tar.gz`` per model a client calls (``sagemaker`` says why); archives are
reproducible: sorted entries, no owners, fixed times.
"""

from __future__ import annotations

import gzip
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.errors import UserInputError
from trtpack.out_files import REPOSITORY
from trtpack.serving.config import read_config

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


@dataclass(frozen=True)
class SageMakerArchive:
    path: Path
    entry: str  # the model SageMaker loads from this archive
    members: tuple[str, ...]  # every model folder in it (entry first)

    @property
    def target_model(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class SageMakerPackage:
    dest: Path
    repository: Path
    archives: tuple[SageMakerArchive, ...]
    note: Path


def is_model_repository(path: Path) -> bool:
    return path.is_dir() and any(path.glob("*/config.pbtxt"))


def find_model_repository(path: Path) -> Path:
    """The model repository of a build output folder (or the repository itself)."""
    if not path.exists():
        raise UserInputError(f"'{path}' does not exist")
    for candidate in (path / REPOSITORY, path):
        if is_model_repository(candidate):
            return candidate
    raise UserInputError(
        f"'{path}' is neither a trtpack build output (with {REPOSITORY}/) nor a Triton model "
        "repository (folders with config.pbtxt)"
    )


def model_configs(repository: Path) -> dict[str, ModelConfig]:
    """Each model folder's name -> its parsed ``config.pbtxt``."""
    return {p.parent.name: read_config(p) for p in sorted(repository.glob("*/config.pbtxt"))}


def ensemble_members(name: str, configs: dict[str, ModelConfig],
                     seen: tuple[str, ...] = ()) -> list[str]:
    """An ensemble's member models, nested ensembles included, in first-use order."""
    if name in seen:
        raise UserInputError(f"ensemble '{name}' contains itself")
    found: list[str] = []
    for step in configs[name].ensemble_scheduling.step:
        member = step.model_name
        if member not in configs:
            raise UserInputError(f"ensemble '{name}' calls '{member}', which is not in the "
                                 "repository")
        for m in [member, *(ensemble_members(member, configs, (*seen, name))
                            if configs[member].platform == "ensemble" else [])]:
            if m not in found:
                found.append(m)
    return found


def archive_contents(repository: Path) -> list[tuple[str, list[str]]]:
    """(entry model, model folders in its archive) for each archive to write."""
    configs = model_configs(repository)
    ensembles = [n for n, c in configs.items() if c.platform == "ensemble"]
    in_ensemble = {m for e in ensembles for m in ensemble_members(e, configs)}
    archives: list[tuple[str, list[str]]] = []
    for name, config in configs.items():
        if config.platform == "ensemble":
            archives.append((name, [name, *ensemble_members(name, configs)]))
        elif not (config.backend == "python" and name in in_ensemble):
            archives.append((name, [name]))
    return archives


def add_tree(tar: tarfile.TarFile, folder: Path, arcname: str) -> None:
    """Regular files and folders only (hard links in the repository become copies)."""
    paths = [folder, *sorted(folder.rglob("*"))]
    for path in paths:
        name = arcname if path == folder else f"{arcname}/{path.relative_to(folder).as_posix()}"
        info = tarfile.TarInfo(name)
        info.mtime = 0
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        if path.is_dir():
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        elif path.is_file():
            info.size = path.stat().st_size
            info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            with path.open("rb") as f:
                tar.addfile(info, f)


def write_archive(repository: Path, models: list[str], path: Path,
                  compresslevel: int = 1) -> None:
    """A tar.gz of model folders, at gzip level 1 by default: weights barely compress, and
    level 0 writes a stored gzip stream at disk speed (the figures: benchmarks/README.md,
    "Figures behind design choices")."""
    tmp = path.with_name(path.name + ".partial")
    with tmp.open("wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                          compresslevel=compresslevel) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for model in models:
            add_tree(tar, repository / model, model)
    tmp.replace(path)
