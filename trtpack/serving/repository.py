"""Write a whole Triton model repository for one built model.

    dest/
      <name>/                 the model: TensorRT engine (model.plan) or ONNX (model.onnx)
      <name>_cpu/             --fallback-cpu: the FP32 ONNX on ONNX Runtime, KIND_CPU
      <name>_tokenizer/       --serve text: Python backend, tokenizer files in 1/tokenizer/
      <name>_postprocess/     --serve text, when the task has one (embeddings, labels)
      <name>_ensemble/        --serve text: TEXT -> tokenizer -> model -> postprocess
      <name>_cpu_ensemble/    --serve text with --fallback-cpu: the same through <name>_cpu

Every ``config.pbtxt`` is built from the model's real I/O through Triton's protobuf schema
and checked before this returns: each model's config against its ONNX I/O, each ensemble's
wiring member by member. Nothing is printed; problems the user can fix are
``UserInputError``s raised before anything is written.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trtpack.errors import UserInputError
from trtpack.onnx_files import link_or_copy
from trtpack.recipe import Recipe, TritonSettings
from trtpack.serving import ensemble as ens
from trtpack.serving.config import (
    NUMPY_TO_TRITON,
    InstanceKind,
    ModelIO,
    check_config,
    model_config,
    model_io_from_onnx,
    write_config,
)
from trtpack.shapes import ShapeProfile
from trtpack.tokenizer_files import VOCABULARY_FILES, has_tokenizer, tokenizer_files

ServeMode = Literal["tensor", "text"]
Role = Literal["model", "cpu_fallback", "tokenizer", "postprocess", "ensemble"]

REPOSITORY = "model_repository"
"""The Triton model repository's folder in a build's output."""
ONNX_FILENAME = "model.onnx"
VERSION = "1"


@dataclass(frozen=True)
class ServedModel:
    """One model directory of the repository."""

    name: str
    role: Role
    path: Path
    backend: str  # tensorrt_plan | onnxruntime_onnx | python | ensemble
    members: tuple[str, ...] = ()  # ensembles: the models their steps call


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


@dataclass(frozen=True)
class TokenizerInfo:
    pad_id: int
    model_max_length: int | None
    padding_side: str = "right"
    truncation_side: str = "right"


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


def prepare_tokenizer(tokenizer_dir: Path, dst: Path) -> TokenizerInfo:
    """Copy the tokenizer files into ``dst``; write ``tokenizer.json`` if only a vocab exists.

    The served model loads ``tokenizer.json`` with the ``tokenizers`` package; a folder with
    only ``vocab.txt`` etc. is converted once here with transformers' fast tokenizer.
    """
    files = tokenizer_files(tokenizer_dir)
    for f in files:
        link_or_copy(f, dst / f.name)
    if not (dst / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), use_fast=True)
        if not getattr(tok, "is_fast", False):
            raise UserInputError(
                f"--serve text: the tokenizer in {tokenizer_dir} has no fast (tokenizer.json) "
                "form, which the served tokenizer model needs"
            )
        tok.backend_tokenizer.save(str(dst / "tokenizer.json"))
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(dst / "tokenizer.json"))
    settings: dict[str, Any] = {}
    if (dst / "tokenizer_config.json").is_file():
        settings = json.loads((dst / "tokenizer_config.json").read_text(encoding="utf-8"))
    pad_id: int | None = None
    pad = settings.get("pad_token")
    if isinstance(pad, dict):
        pad = pad.get("content")
    if isinstance(pad, str):
        pad_id = tokenizer.token_to_id(pad)
    if pad_id is None and tokenizer.padding is not None:
        pad_id = int(tokenizer.padding["pad_id"])
    max_len = settings.get("model_max_length")
    model_max_length = int(max_len) if isinstance(max_len, int | float) and max_len < 1e6 else None
    sides = [str(settings.get(k) or "right") for k in ("padding_side", "truncation_side")]
    return TokenizerInfo(pad_id if pad_id is not None else 0, model_max_length, *sides)


def _warmup(config: Any, io: ModelIO, profiles: Sequence[ShapeProfile]) -> None:
    """One warmup sample per profile at its opt shape (zeros for integers, random floats)."""
    from tritonclient.grpc import model_config_pb2 as pb

    batched = config.max_batch_size > 0
    for k, profile in enumerate(profiles):
        opt = {name: r.opt for name, r in profile.shapes.items()}
        batch = min(max(1, opt[next(iter(opt))][0]), config.max_batch_size) if batched else 1
        sample = config.model_warmup.add(name=f"profile_{k}_opt", batch_size=batch, count=1)
        for t in io.inputs:
            shape = opt.get(t.name, t.shape)
            dims = list(shape[1:] if batched else shape)
            entry = sample.inputs[t.name]
            entry.data_type = pb.DataType.Value(NUMPY_TO_TRITON[t.dtype])
            entry.dims.extend(dims)
            if t.dtype.startswith("int"):
                entry.zero_data = True
            else:
                entry.random_data = True


def onnx_model_config(name: str, io: ModelIO, profiles: Sequence[ShapeProfile],
                      settings: TritonSettings, kind: InstanceKind) -> Any:
    config = model_config(name, io, profiles, settings, platform="onnxruntime_onnx",
                          kind=kind, default_model_filename=ONNX_FILENAME)
    if settings.warmup:
        _warmup(config, io, profiles)
    return config


def _same_io(a: ModelIO, b: ModelIO) -> bool:
    def sig(io: ModelIO) -> list[tuple[str, str, int]]:
        return [(t.name, t.dtype, len(t.shape)) for t in (*io.inputs, *io.outputs)]

    return sig(a) == sig(b)


def _check_no_conflict(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UserInputError(f"model repository destination {dest} exists and is not empty")


def validate_options(*, recipe: Recipe, serve: ServeMode, fallback_cpu: bool, engine: bool,
                     gpu: bool, tokenizer_dir: Path | None) -> None:
    """The option combinations that cannot make a repository, as clear user errors."""
    if serve not in ("tensor", "text"):
        raise UserInputError(f"--serve must be 'tensor' or 'text', got '{serve}'")
    if serve == "text":
        if not recipe.tokenizer:
            raise UserInputError(
                f"--serve text needs a tokenizer, and model '{recipe.name}' has none "
                f"(task {recipe.task}, recipe 'tokenizer: false'); use --serve tensor"
            )
        if not has_tokenizer(tokenizer_dir):
            raise UserInputError(
                f"--serve text: no tokenizer files in {tokenizer_dir} "
                f"(expected one of {', '.join(VOCABULARY_FILES)})"
            )
    if fallback_cpu and not engine and not gpu:
        raise UserInputError(
            "--fallback-cpu adds an ONNX Runtime CPU model beside a GPU model; this build "
            "already serves the ONNX model with ONNX Runtime on the CPU"
        )


def write_model_repository(
    dest: Path,
    *,
    recipe: Recipe,
    profiles: Sequence[ShapeProfile],
    model_path: Path,
    gpu: bool = False,
    serve: ServeMode = "tensor",
    fallback_cpu: bool = False,
    fallback_onnx: Path | None = None,
    tokenizer_dir: Path | None = None,
    model_config_json: Path | None = None,
    settings: TritonSettings | None = None,
    name: str | None = None,
    tuning_dir: Path | None = None,
    repository_ref: str | None = None,
) -> ModelRepository:
    """Write the Triton model repository for one built model into ``dest`` (new or empty).

    ``model_path`` is what is served as ``<name>``: a TensorRT ``model.plan`` (with the
    ``model.plan.json`` the engine stage writes beside it: the engine's real I/O) or an ONNX
    file, served by ONNX Runtime on KIND_GPU when ``gpu`` else KIND_CPU. ``fallback_cpu``
    adds ``<name>_cpu``: ``fallback_onnx`` (the FP32 ONNX; default ``model_path`` when that
    is an ONNX) on ONNX Runtime with KIND_CPU instances. ``serve="text"`` adds the tokenizer,
    post-processing and ensemble models; it needs ``tokenizer_dir`` and, for classifiers'
    label names, ``model_config_json`` (the model's config.json). ``settings`` default to
    ``recipe.triton``. ``tuning_dir`` (outside ``dest``) receives a perf_analyzer script, a
    Model Analyzer config and a README; they name the repository by ``repository_ref``
    (relative to ``tuning_dir``; default the relative path between the two folders now, so
    pass e.g. ``"../model_repository"`` when both are written under temporary names).
    """
    settings = settings or recipe.triton
    name = name or recipe.name
    if not profiles:
        raise UserInputError("a model repository needs at least one shape profile")
    if not model_path.is_file():
        raise UserInputError(f"model file {model_path} does not exist")
    engine = model_path.suffix == ".plan"
    validate_options(recipe=recipe, serve=serve, fallback_cpu=fallback_cpu, engine=engine,
                     gpu=gpu, tokenizer_dir=tokenizer_dir)
    if tuning_dir is not None and tuning_dir.resolve().is_relative_to(dest.resolve()):
        raise UserInputError("tuning_dir must be outside the model repository")
    fallback_src = fallback_onnx or (None if engine else model_path)
    if fallback_cpu and (fallback_src is None or not fallback_src.is_file()):
        raise UserInputError(f"--fallback-cpu needs the FP32 ONNX model; got {fallback_src}")
    _check_no_conflict(dest)

    if engine:
        from trtpack.engine.provenance import EngineProvenance, provenance_path

        prov = provenance_path(model_path)
        if not prov.is_file():
            raise UserInputError(f"{model_path} has no {prov.name}: the engine's I/O is unknown")
        io = EngineProvenance.load(prov).model_io()
    else:
        io = model_io_from_onnx(model_path)
    fields: dict[str, ens.TokenField] = {}
    plan: ens.PostprocessPlan | None = None
    if serve == "text":
        fields = ens.token_fields(recipe, io)
        plan = ens.postprocess_plan(recipe, io, fields, model_config_json, tokenizer_dir)

    warnings: list[str] = []
    if settings.cuda_graphs and not engine:
        warnings.append("cuda_graphs is a TensorRT option; this repository has no engine")
    dest.mkdir(parents=True, exist_ok=True)
    models: list[ServedModel] = []

    def write(model_name: str, role: Role, backend: str, config: Any,
              members: tuple[str, ...] = ()) -> Path:
        model_dir = dest / model_name
        (model_dir / VERSION).mkdir(parents=True, exist_ok=True)
        write_config(model_dir / "config.pbtxt", config)
        models.append(ServedModel(model_name, role, model_dir, backend, members))
        return model_dir / VERSION

    problems: list[str] = []
    if engine:
        from trtpack.engine.triton_config import write_engine_model

        write_engine_model(dest, name, model_path, profiles, settings)  # checks its config
        models.append(ServedModel(name, "model", dest / name, "tensorrt_plan"))
    else:
        kind: InstanceKind = "KIND_GPU" if gpu else "KIND_CPU"
        main_config = onnx_model_config(name, io, profiles, settings, kind)
        copy_onnx(model_path, write(name, "model", "onnxruntime_onnx", main_config))
        problems += check_config(main_config, io)

    cpu_name = f"{name}_cpu"
    if fallback_cpu:
        assert fallback_src is not None
        cpu_io = model_io_from_onnx(fallback_src)
        if [t.name for t in cpu_io.inputs] != [t.name for t in io.inputs]:
            raise UserInputError(f"fallback ONNX {fallback_src} has other inputs than the model")
        cpu_config = onnx_model_config(cpu_name, cpu_io, profiles, settings, "KIND_CPU")
        copy_onnx(fallback_src, write(cpu_name, "cpu_fallback", "onnxruntime_onnx", cpu_config))
        problems += check_config(cpu_config, cpu_io)

    if serve == "text":
        assert tokenizer_dir is not None
        tok_name, post_name = f"{name}_tokenizer", f"{name}_postprocess"
        info = prepare_tokenizer(tokenizer_dir, dest / tok_name / VERSION / ens.TOKENIZER_FOLDER)
        seq = ens.sequence_range(fields, profiles, info.model_max_length)
        tok_config = ens.tokenizer_config(tok_name, io, fields, profiles, settings, seq,
                                          info.pad_id, info.padding_side, info.truncation_side)
        shutil.copyfile(ens.TEMPLATES_DIR / "tokenizer.py",
                        write(tok_name, "tokenizer", "python", tok_config) / "model.py")
        if plan is not None:
            post_config = ens.postprocess_config(post_name, plan, profiles, settings)
            post_version = write(post_name, "postprocess", "python", post_config)
            shutil.copyfile(ens.TEMPLATES_DIR / "postprocess.py", post_version / "model.py")
            if plan.labels:
                (post_version / ens.LABELS_FILE).write_text(json.dumps(list(plan.labels)),
                                                            encoding="utf-8")
        targets = [(name, f"{name}_ensemble")]
        if fallback_cpu and _same_io(cpu_io, io):
            targets.append((cpu_name, f"{name}_cpu_ensemble"))
        elif fallback_cpu:
            warnings.append(f"no {name}_cpu_ensemble: the FP32 ONNX's I/O types differ from "
                            "the engine's, so one tokenizer cannot feed both")
        for model_name, ensemble_name in targets:
            steps = ens.text_ensemble_steps(tok_name, model_name, io, fields,
                                            post_name if plan else None, plan)
            outputs = plan.outputs if plan is not None else io.outputs
            e_io = ModelIO(ens.tokenizer_io(io, fields).inputs, tuple(outputs))
            e_config = ens.ensemble_config(ensemble_name, e_io, profiles, settings, steps)
            write(ensemble_name, "ensemble", "ensemble", e_config,
                  tuple(s.model for s in steps))
            problems += ens.check_ensemble(dest, ensemble_name)

    if problems:  # trtpack wrote configs that disagree with the model: a bug, not user input
        raise RuntimeError("model repository checks failed:\n  " + "\n  ".join(problems))
    repo = ModelRepository(dest, models, warnings)
    if tuning_dir is not None:
        from trtpack.serving.tuning import write_tuning_files

        repo.tuning_files = write_tuning_files(tuning_dir, repo, profiles, settings,
                                               repository_ref)
    return repo
