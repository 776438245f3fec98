"""``trtpack inspect PATH``: an engine's or a model repository's provenance and I/O, and
whether it can run on this machine. Returns data; the CLI renders it.

PATH may be a ``model.plan`` (its ``model.plan.json`` beside it), a ``model.plan.json``, a
Triton model repository, one model directory of it, or a build output folder (its
``model_repository/`` and ``artifacts/engine/``). The I/O comes from the provenance, which
recorded it from the deserialized engine at build time; an engine without provenance is
deserialized when TensorRT is installed here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from trtpack.diagnostics.model_files import (
    BuildRecord,
    OnnxCheck,
    OnnxInspection,
    build_record,
    check_onnx_model,
    inspect_onnx,
    served_precision,
)
from trtpack.engine.provenance import EngineProvenance, provenance_path, runs_here
from trtpack.errors import UserInputError
from trtpack.model_io import ModelIO, engine_model_io

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelInput, ModelOutput


@dataclass(frozen=True)
class MachineFacts:
    """What decides whether an engine runs here (detected, or given in tests)."""

    gpu_name: str | None
    compute_capability: tuple[int, int] | None
    tensorrt_version: str | None

    @classmethod
    def detect(cls) -> MachineFacts:
        from trtpack.machine.gpus import detect_gpu
        from trtpack.machine.packages import tensorrt_version

        gpu = detect_gpu()
        return cls(gpu.name if gpu else None, gpu.compute_capability if gpu else None,
                   tensorrt_version())


@dataclass
class EngineInspection:
    """One engine: its provenance (None when it has no ``model.plan.json``), I/O, and
    whether it can run on this machine (None: unknown)."""

    path: str
    provenance: EngineProvenance | None
    io: ModelIO | None
    runs_here: bool | None
    reasons: list[str] = field(default_factory=list)


class ConfigTensor(TypedDict):
    """A tensor as config.pbtxt declares it."""

    name: str
    data_type: str  # TYPE_FP32, ...
    dims: list[int]
    # ``dims`` with each dynamic dimension (-1) named where the served ONNX or the build's
    # recipe names it (``sequence``), as the ONNX view shows it
    axes: list[str | int]


@dataclass
class ModelInspection:
    """One model of a Triton repository: its config and the engines of its versions."""

    name: str
    path: str
    platform: str
    max_batch_size: int
    inputs: list[ConfigTensor]
    outputs: list[ConfigTensor]
    instance_kind: str
    profiles: list[str]
    engines: list[EngineInspection] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    gpu_families: list[GpuFamily] = field(default_factory=list)  # cc_model_filenames entries
    onnx: OnnxCheck | None = None  # an ONNX Runtime model, when checked
    precision: str | None = None  # what its latest version serves (None: not known)

    @property
    def checked(self) -> bool:
        """Whether there is something to say about running it here: engines or an ONNX."""
        return bool(self.engines) or self.onnx is not None

    @property
    def runs_here(self) -> bool | None:
        """With one engine per GPU family (``trtpack merge``) the model runs here when one of
        them does; otherwise when every engine does (None: unknown or no engine). An ONNX
        Runtime model runs here when ONNX Runtime loads it on this machine."""
        if not self.engines and self.onnx is not None:
            return self.onnx.runs_here
        values = [e.runs_here for e in self.engines]
        if self.gpu_families:
            if any(v is True for v in values):
                return True
            return None if any(v is None for v in values) else False
        if any(v is False for v in values):
            return False
        return None if not values or any(v is None for v in values) else True


@dataclass(frozen=True)
class GpuFamily:
    """One ``cc_model_filenames`` entry of a model: a compute capability and its engine."""

    compute_capability: str
    filename: str
    targets: tuple[str, ...]  # the instance families its engine is meant for
    gpus: tuple[str, ...]
    present: bool  # the file is in the version folder
    serves: str | None = None  # which GPUs the engine is meant for, in words (None: unknown)
    not_for: tuple[str, ...] = ()  # families of that compute capability it is not meant for


@dataclass
class Inspection:
    """Everything found under the inspected path."""

    path: str
    kind: str  # "build" | "model_repository" | "model" | "onnx" | "engine"
    machine: MachineFacts
    engines: list[EngineInspection] = field(default_factory=list)
    models: list[ModelInspection] = field(default_factory=list)
    onnx: OnnxInspection | None = None  # kind "onnx"
    build: BuildRecord | None = None  # the trtpack build the path is in, when it is in one

    @property
    def runs_here(self) -> bool | None:
        """True when every engine found can run here, False when one cannot, None if unknown
        (or when there is no engine)."""
        values = [e.runs_here for e in self.engines] + \
            [m.runs_here for m in self.models if m.checked] + \
            ([self.onnx.runs_here] if self.onnx is not None else [])
        if any(v is False for v in values):
            return False
        if not values or any(v is None for v in values):
            return None
        return True

    def all_engines(self) -> list[EngineInspection]:
        return [*self.engines, *(e for m in self.models for e in m.engines)]


def _io_from_engine_file(plan: Path) -> ModelIO | None:
    """Deserialize an engine to read its I/O (only when TensorRT is installed and works)."""
    from trtpack.machine.gpus import detect_gpu
    from trtpack.machine.packages import tensorrt_available

    if not tensorrt_available() or detect_gpu() is None:
        return None
    from trtpack.runtimes import tensorrt as tensorrt_api

    try:
        return engine_model_io(tensorrt_api.engine_tensors(tensorrt_api.load_engine(plan)))
    except Exception:  # an engine for another GPU/TensorRT does not deserialize: unknown I/O
        return None


def inspect_engine(plan: Path, machine: MachineFacts) -> EngineInspection:
    prov_file = provenance_path(plan)
    if not prov_file.is_file():
        io = _io_from_engine_file(plan)
        return EngineInspection(str(plan), None, io, None,
                                [f"no {prov_file.name}: where the engine was built is unknown"])
    try:
        prov = EngineProvenance.load(prov_file)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise UserInputError(f"{prov_file} is not a trtpack provenance file: {e}") from None
    ok, reasons = runs_here(prov, machine.gpu_name, machine.compute_capability,
                            machine.tensorrt_version)
    return EngineInspection(str(plan), prov, prov.model_io(), ok, reasons)


def _dims(tensors: Iterable[ModelInput | ModelOutput],
          names: Mapping[str, Sequence[str | int]]) -> list[ConfigTensor]:
    """Each tensor's dims, its dynamic ones named from ``names`` (tensor -> its axes without
    the batch) where the rank agrees."""
    from tritonclient.grpc import model_config_pb2 as pb

    found: list[ConfigTensor] = []
    for t in tensors:
        dims = list(t.dims)
        named = list(names.get(t.name, ()))
        axes: list[str | int] = [
            named[i] if d == -1 and len(named) == len(dims) and isinstance(named[i], str)
            else d for i, d in enumerate(dims)]
        found.append({"name": t.name, "data_type": pb.DataType.Name(t.data_type),
                      "dims": dims, "axes": axes})
    return found


def _axis_names(model_dir: Path, version: Path, filename: str, batched: bool
                ) -> dict[str, list[str | int]]:
    """Tensor name -> its axes without the batch, as the served ONNX file names them (its
    ``dim_param``), else as the build's recipe (``recipe.yaml`` beside the repository) does;
    empty when neither is there."""
    import onnx
    import yaml

    start = 1 if batched else 0
    served = version / filename
    if served.suffix == ".onnx" and served.is_file():
        try:
            graph = onnx.load(str(served), load_external_data=False).graph
        except Exception:  # an unreadable file is the ONNX check's to report
            graph = None
        if graph is not None:
            return {v.name: [d.dim_param or d.dim_value
                             for d in v.type.tensor_type.shape.dim][start:]
                    for v in (*graph.input, *graph.output)}
    recipe = model_dir.parent.parent / "recipe.yaml"
    try:
        data = yaml.safe_load(recipe.read_text(encoding="utf-8")) if recipe.is_file() else None
    except (OSError, yaml.YAMLError):
        data = None
    if not isinstance(data, dict):
        return {}
    return {t["name"]: list(t["axes"])[start:]
            for t in (*(data.get("inputs") or []), *(data.get("outputs") or []))
            if isinstance(t, dict) and isinstance(t.get("name"), str)
            and isinstance(t.get("axes"), list)}


def inspect_model_dir(model_dir: Path, machine: MachineFacts,
                      load_onnx: bool = False) -> ModelInspection:
    from tritonclient.grpc import model_config_pb2 as pb

    from trtpack.serving.config import check_config, read_config

    config = read_config(model_dir / "config.pbtxt")
    kinds = [pb.ModelInstanceGroup.Kind.Name(g.kind) for g in config.instance_group]
    filename = config.default_model_filename or "model.plan"
    versions = sorted((p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()),
                      key=lambda p: int(p.name))
    served = config.default_model_filename or (
        "model.onnx" if "onnxruntime" in (config.platform + config.backend) else filename)
    names = _axis_names(model_dir, versions[-1] if versions else model_dir / "1", served,
                        config.max_batch_size > 0)
    model = ModelInspection(
        name=config.name or model_dir.name, path=str(model_dir),
        platform=config.platform or config.backend, max_batch_size=config.max_batch_size,
        inputs=_dims(config.input, names), outputs=_dims(config.output, names),
        instance_kind=",".join(kinds) or "KIND_AUTO",
        profiles=[p for g in config.instance_group for p in g.profile],
    )
    by_cc = dict(sorted(config.cc_model_filenames.items()))
    for version in versions:
        files = [version / filename] + [version / f for f in by_cc.values()]
        for plan in dict.fromkeys(files):
            if config.platform == "tensorrt_plan" and plan.is_file():
                engine = inspect_engine(plan, machine)
                model.engines.append(engine)
                if engine.io is not None:
                    model.problems += [f"version {version.name}: {p}"
                                       for p in check_config(config, engine.io)]
    latest = versions[-1] if versions else model_dir / "1"
    model.precision = served_precision(
        config, latest, next((e.provenance.precision for e in model.engines
                              if e.provenance is not None), None))
    if load_onnx and (config.platform == "onnxruntime_onnx" or config.backend == "onnxruntime"):
        model.onnx = check_onnx_model(latest / (config.default_model_filename or "model.onnx"),
                                      "KIND_GPU" in kinds, machine.gpu_name is not None)
    from trtpack.serving.engine_builds import served_compute_capability

    built_for = {e.path: "{}.{}".format(*served_compute_capability(e.provenance))
                 for e in model.engines if e.provenance is not None}
    provenances = {e.path: e.provenance for e in model.engines}
    for cc, file in by_cc.items():
        model.gpu_families.append(_gpu_family(cc, file, (latest / file).is_file(),
                                              provenances.get(str(latest / file))))
        if not (latest / file).is_file():
            model.problems.append(f"cc_model_filenames names {file} for compute capability "
                                  f"{cc}, which is not in version {latest.name}")
        elif built_for.get(str(latest / file), cc) != cc:
            model.problems.append(f"cc_model_filenames gives {file} to compute capability "
                                  f"{cc}, but it was built for "
                                  f"{built_for[str(latest / file)]}")
    return model


def _gpu_family(cc: str, filename: str, present: bool,
                prov: EngineProvenance | None = None) -> GpuFamily:
    """The families a ``cc_model_filenames`` entry serves: with the engine's provenance, those
    its hardware compatibility is meant for (``none``: its GPU model alone), else every
    family of that compute capability."""
    from trtpack.machine.targets import TARGETS, engine_serves, families_served

    major, _, minor = cc.partition(".")
    key = (int(major), int(minor or 0)) if major.isdigit() and (minor or "0").isdigit() \
        else None
    same = [t for t in TARGETS if t.gpu is not None and t.gpu.compute_capability == key]
    serves = None
    served = same
    if prov is not None and key is not None:
        level = prov.hardware_compatibility
        served = list(families_served(level, prov.gpu_name, key))
        serves = engine_serves(level, prov.gpu_name, key)
    return GpuFamily(cc, filename, tuple(t.name for t in served),
                     tuple(dict.fromkeys(t.gpu.name for t in served if t.gpu)), present,
                     serves, tuple(t.name for t in same if t not in served))


def _model_dirs(repo: Path) -> list[Path]:
    return sorted(p for p in repo.iterdir() if p.is_dir() and (p / "config.pbtxt").is_file())


KINDS = {"build": "a trtpack build folder", "model_repository": "a Triton model repository",
         "model": "one model of a Triton model repository", "onnx": "an ONNX model",
         "engine": "a TensorRT engine"}
ENGINE_SUFFIXES = (".plan", ".engine", ".trt")


def inspect_path(path: Path, machine: MachineFacts | None = None,
                 load_onnx: bool = False) -> Inspection:
    """Say what ``path`` is — a build folder, a model repository (or one model of it), an
    ONNX file, an engine — and inspect it; anything else is a ``UserInputError`` (exit 2).
    ``load_onnx``: also load a repository's ONNX Runtime models here (``inspect --check``);
    an ONNX file given as PATH is always loaded."""
    machine = machine or MachineFacts.detect()
    if not path.exists():
        raise UserInputError(f"'{path}' does not exist")
    found = _inspect(path, machine, load_onnx)
    found.build = build_record(path)
    return found


def _inspect(path: Path, machine: MachineFacts, load_onnx: bool) -> Inspection:
    if path.is_file():
        if path.name.endswith(".plan.json"):
            plan = path.with_name(path.name[: -len(".json")])
            if not plan.is_file():
                raise UserInputError(f"'{path}' describes {plan.name}, which is not beside it")
            return Inspection(str(path), "engine", machine,
                              engines=[inspect_engine(plan, machine)])
        if path.suffix in ENGINE_SUFFIXES or provenance_path(path).is_file():
            return Inspection(str(path), "engine", machine,
                              engines=[inspect_engine(path, machine)])
        if path.suffix == ".onnx":
            return Inspection(str(path), "onnx", machine, onnx=inspect_onnx(path))
        raise UserInputError(
            f"'{path}' is a file trtpack does not inspect ({path.stat().st_size:,} bytes)",
            hint="give an ONNX file (.onnx), an engine (model.plan), a Triton model "
                 "repository or a trtpack build folder")
    if (path / "config.pbtxt").is_file():
        return Inspection(str(path), "model", machine,
                          models=[inspect_model_dir(path, machine, load_onnx)])
    if _model_dirs(path):
        return Inspection(str(path), "model_repository", machine,
                          models=[inspect_model_dir(d, machine, load_onnx)
                                  for d in _model_dirs(path)])
    repo = path / "model_repository"
    engine_dir = path / "artifacts" / "engine"
    if repo.is_dir() or engine_dir.is_dir():
        result = Inspection(str(path), "build", machine)
        if repo.is_dir():
            result.models = [inspect_model_dir(d, machine, load_onnx)
                             for d in _model_dirs(repo)]
        if (engine_dir / "model.plan").is_file() and not any(
                m.engines for m in result.models):
            result.engines = [inspect_engine(engine_dir / "model.plan", machine)]
        return result
    if (path / "report.json").is_file():  # a failed build's OUT.failed: its report and logs
        return Inspection(str(path), "build", machine)
    raise UserInputError(
        f"'{path}' is not an engine (model.plan), an ONNX file, a model repository or a "
        "trtpack build folder")
