"""The folder layout of a Triton model repository, and the files each model directory holds.

    model_repository/
      <name>/config.pbtxt     every model: its config, from ``serving.config``
      <name>/1/model.plan     a TensorRT engine, with model.plan.json (its provenance) beside it
      <name>/1/model.onnx     an ONNX model, with its external data files under their own names
      <name>/1/model.py       a Python-backend helper (tokenizer, post-processing)

``ModelRepository`` describes what was written; ``write_engine_model`` and ``copy_onnx`` put
a model's files in place.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from trtpack.engine.provenance import PLAN_FILENAME, EngineProvenance, provenance_path
from trtpack.engine.triton_release import TritonServing
from trtpack.errors import UserInputError
from trtpack.machine.targets import engine_serves
from trtpack.onnx_tools.files import link_or_copy
from trtpack.serving.config import (
    CONFIG_FILE,
    ENGINE_PLATFORM,
    ONNX_FILENAME,
    ONNX_PLATFORM,
    check_config,
    engine_model_config,
    write_config,
)
from trtpack.shapes import ShapeProfile
from trtpack.sources.recipe import TritonSettings

VERSION = "1"

Role = Literal["model", "cpu_fallback", "tokenizer", "postprocess", "ensemble"]


@dataclass(frozen=True)
class ServedModel:
    """One model directory of the repository."""

    name: str
    role: Role
    path: Path
    backend: str  # tensorrt_plan | onnxruntime_onnx | python | ensemble
    members: tuple[str, ...] = ()  # ensembles: the models their steps call

    @property
    def model_file(self) -> Path | None:
        """The model file its runtime loads: ``1/model.plan`` (TensorRT), ``1/model.onnx``
        (ONNX Runtime, its external data beside it); None for Python and ensemble models."""
        names = {ENGINE_PLATFORM: PLAN_FILENAME, ONNX_PLATFORM: ONNX_FILENAME}
        return self.path / VERSION / names[self.backend] if self.backend in names else None


@dataclass
class ModelRepository:
    root: Path
    models: list[ServedModel]
    warnings: list[str] = field(default_factory=list)
    tuning_files: list[Path] = field(default_factory=list)

    def by_role(self, role: Role) -> list[ServedModel]:
        return [m for m in self.models if m.role == role]

    def get(self, name: str) -> ServedModel:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)


def onnx_external_files(path: Path) -> list[str]:
    """Relative locations of the external data files an ONNX model refers to."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    tensors = list(model.graph.initializer)
    for node in model.graph.node:
        tensors.extend(a.t for a in node.attribute if a.HasField("t"))
    locations: set[str] = set()
    for t in tensors:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            locations.update(e.value for e in t.external_data if e.key == "location")
    return sorted(locations)


def copy_onnx(src: Path, version_dir: Path) -> None:
    """The ONNX as ``model.onnx`` with its external data files under their own names."""
    for location in onnx_external_files(src):
        data = src.parent / location
        if not data.is_file():
            raise UserInputError(f"{src} refers to external data '{location}', which is missing")
        # a copy: onnx (>= 1.23) refuses external data files with more than one hard link
        version_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(data, version_dir / location)
    link_or_copy(src, version_dir / ONNX_FILENAME)


def engine_triton_serving(model_dir: Path) -> TritonServing | None:
    """Which Triton serves the engine(s) of a model directory (``<name>/1/*.plan`` with their
    provenance; the merged engines of one model share their TensorRT), or None (no engine)."""
    found = sorted((model_dir / VERSION).glob("*.plan.json"))
    return EngineProvenance.load(found[0]).triton_serving() if found else None


def write_engine_model(repo: Path, name: str, plan: Path, profiles: Sequence[ShapeProfile],
                       settings: TritonSettings) -> Path:
    """A ``tensorrt_plan`` model directory ``repo/name/`` with ``1/model.plan``, its
    ``model.plan.json`` beside it, and a ``config.pbtxt`` derived from the engine's I/O as
    recorded in the provenance (no TensorRT needed); the config is checked against it, and
    says in a comment which GPUs the engine is meant for (its hardware compatibility)."""
    prov_file = provenance_path(plan)
    if not prov_file.is_file():
        raise UserInputError(f"{plan} has no {prov_file.name}: the engine's I/O is unknown")
    prov = EngineProvenance.load(prov_file)
    io = prov.model_io()
    config = engine_model_config(name, io, profiles, settings)
    problems = check_config(config, io)
    if problems:
        raise UserInputError(f"the config for engine {plan} does not match it: "
                             + "; ".join(problems))
    model_dir = repo / name
    version_dir = model_dir / VERSION
    version_dir.mkdir(parents=True, exist_ok=True)
    link_or_copy(plan, version_dir / PLAN_FILENAME)
    link_or_copy(prov_file, version_dir / provenance_path(Path(PLAN_FILENAME)).name)
    write_config(model_dir / CONFIG_FILE, config, notes=[
        f"{PLAN_FILENAME} is meant for "
        + engine_serves(prov.hardware_compatibility, prov.gpu_name, prov.cc)])
    return model_dir
