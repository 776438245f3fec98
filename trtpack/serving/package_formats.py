"""The formats ``trtpack package --format`` writes: one module per format, one entry here.

A format's module has ``package(path, dest) -> PackageResult`` (the archives it wrote and
the note beside them, by default in ``<path>/<format>``); its entry names the module and
says what it writes (the ``--format`` help). The module is imported only when its format
is chosen."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from trtpack.errors import UserInputError


class PackagedArchive(Protocol):
    @property
    def path(self) -> Path: ...

    @property
    def entry(self) -> str: ...  # the model the archive's server loads

    @property
    def members(self) -> tuple[str, ...]: ...  # the models it holds


class PackageResult(Protocol):
    @property
    def archives(self) -> Sequence[PackagedArchive]: ...

    @property
    def note(self) -> Path: ...  # how to serve what was written


@dataclass(frozen=True)
class PackageFormat:
    name: str
    module: str  # has package(path: Path, dest: Path | None) -> PackageResult
    help: str


FORMATS: tuple[PackageFormat, ...] = (
    PackageFormat("sagemaker", "trtpack.serving.sagemaker",
                  "one <model>.tar.gz per served model for SageMaker multi-model endpoints "
                  "(an ensemble packed with its members), and SAGEMAKER.md"),
)


def format_help() -> str:
    """The ``--format`` help: each format and what it writes."""
    return "; ".join(f"{f.name}: {f.help}" for f in FORMATS) + "."


def package_format(name: str) -> PackageFormat:
    """The format called ``name``, or a user error that lists the choices."""
    for fmt in FORMATS:
        if fmt.name == name:
            return fmt
    raise UserInputError(f"unknown package format {name!r}: choose "
                         + ", ".join(f.name for f in FORMATS))


def package(name: str, path: Path, dest: Path | None = None) -> PackageResult:
    """Write the format ``name`` for the build folder or model repository ``path``."""
    module = importlib.import_module(package_format(name).module)
    result: PackageResult = module.package(path, dest)
    return result
