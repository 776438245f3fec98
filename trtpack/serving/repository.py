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
from typing import TYPE_CHECKING

from trtpack.engine.provenance import EngineProvenance, provenance_path
from trtpack.errors import UserInputError
from trtpack.model_io import ModelIO, model_io_from_onnx
from trtpack.options import Serve
from trtpack.serving.config import (
    CONFIG_FILE,
    CUDA_GRAPHS_NOT_WRITTEN,
    ENGINE_PLATFORM,
    ONNX_PLATFORM,
    InstanceKind,
    check_config,
    onnx_model_config,
    write_config,
)
from trtpack.serving.ensemble import check_ensemble, ensemble_config, text_ensemble_steps
from trtpack.serving.layout import (
    VERSION,
    ModelRepository,
    Role,
    ServedModel,
    copy_onnx,
    write_engine_model,
)
from trtpack.serving.postprocess import (
    LABELS_FILE,
    Postprocessing,
    postprocess_config,
    postprocessing,
)
from trtpack.serving.tokenizer_model import (
    TEMPLATES_DIR,
    TOKENIZER_FOLDER,
    VENDOR_FOLDER,
    TokenField,
    prepare_tokenizer,
    sequence_range,
    token_fields,
    tokenizer_config,
    tokenizer_io,
    vendor_tokenizers,
)
from trtpack.serving.triton_rules import shared_graph_shapes
from trtpack.shapes import ShapeProfile
from trtpack.sources.recipe import Recipe, TritonSettings
from trtpack.sources.tokenizer_files import VOCABULARY_FILES, has_tokenizer

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

    from trtpack.cases import Case


def _same_io(a: ModelIO, b: ModelIO) -> bool:
    def sig(io: ModelIO) -> list[tuple[str, str, int]]:
        return [(t.name, t.dtype, len(t.shape)) for t in (*io.inputs, *io.outputs)]

    return sig(a) == sig(b)


def _check_no_conflict(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UserInputError(f"model repository destination {dest} exists and is not empty")


@dataclass(frozen=True)
class RepositoryPlan:
    """What a model repository holds. ``model_path`` is served as the recipe's name: a
    TensorRT ``model.plan`` (with the ``model.plan.json`` the engine stage writes beside it:
    the engine's real I/O) or an ONNX file, served by ONNX Runtime on KIND_GPU when ``gpu``
    else KIND_CPU. ``fallback_cpu`` adds ``<name>_cpu``: ``fallback_onnx`` (the FP32 ONNX;
    default ``model_path`` when that is an ONNX) on ONNX Runtime with KIND_CPU instances.
    ``serve="text"`` adds the tokenizer, post-processing and ensemble models; it needs
    ``tokenizer_dir`` and, for classifiers' label names, ``model_config_json`` (the model's
    config.json). Triton's settings are ``recipe.triton``. ``tuning_dir`` (outside the
    repository) receives a perf_analyzer script, a Model Analyzer config and a README; they
    name the repository by ``repository_ref`` (relative to ``tuning_dir``; default the
    relative path between the two folders now, so pass e.g. ``"../model_repository"`` when
    both are written under temporary names); ``tuning_cases``, the verified inputs, are
    written there for perf_analyzer to send. Which ``serve`` / ``fallback_cpu`` combinations
    a build may ask for is decided once, by ``api.resolve_options``; the writer checks only
    what the files themselves must provide."""

    recipe: Recipe
    profiles: Sequence[ShapeProfile]
    model_path: Path
    gpu: bool = False
    serve: Serve = "tensor"
    fallback_cpu: bool = False
    fallback_onnx: Path | None = None
    tokenizer_dir: Path | None = None
    model_config_json: Path | None = None
    tuning_dir: Path | None = None
    repository_ref: str | None = None
    tuning_cases: Sequence[Case] = ()

    @property
    def name(self) -> str:
        return self.recipe.name

    @property
    def settings(self) -> TritonSettings:
        return self.recipe.triton

    @property
    def engine(self) -> bool:
        return self.model_path.suffix == ".plan"

    @property
    def fallback_source(self) -> Path | None:
        """The ONNX ``<name>_cpu`` serves."""
        return self.fallback_onnx or (None if self.engine else self.model_path)


@dataclass
class RepositoryWriter:
    """The models written into ``dest`` so far, and what their checks found."""

    dest: Path
    models: list[ServedModel] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def add(self, model_name: str, role: Role, backend: str, config: ModelConfig,
            members: tuple[str, ...] = ()) -> Path:
        """``<model_name>/config.pbtxt``; the model's version folder, to put its files in."""
        model_dir = self.dest / model_name
        (model_dir / VERSION).mkdir(parents=True, exist_ok=True)
        write_config(model_dir / CONFIG_FILE, config)
        self.models.append(ServedModel(model_name, role, model_dir, backend, members))
        return model_dir / VERSION

    def add_onnx(self, model_name: str, role: Role, onnx: Path, io: ModelIO,
                 plan: RepositoryPlan, kind: InstanceKind) -> None:
        config = onnx_model_config(model_name, io, plan.profiles, plan.settings, kind)
        copy_onnx(onnx, self.add(model_name, role, ONNX_PLATFORM, config))
        self.problems += check_config(config, io)


def write_model_repository(dest: Path, plan: RepositoryPlan) -> ModelRepository:
    """Write the Triton model repository ``plan`` describes into ``dest`` (new or empty)."""
    _check_plan(dest, plan)
    io = _served_io(plan)
    text = None  # the tokenizer's fields and the post-processing, checked before writing
    if plan.serve == "text":
        fields = token_fields(plan.recipe, io)
        text = fields, postprocessing(plan.recipe, io, fields, plan.model_config_json,
                                      plan.tokenizer_dir)
    writer = RepositoryWriter(dest)
    settings = plan.settings
    if settings.cuda_graphs and not plan.engine:
        writer.warnings.append("cuda_graphs is a TensorRT option; this repository has no engine")
    elif settings.cuda_graphs and not shared_graph_shapes(plan.profiles):
        writer.warnings.append(CUDA_GRAPHS_NOT_WRITTEN)
    dest.mkdir(parents=True, exist_ok=True)
    if plan.engine:
        write_engine_model(dest, plan.name, plan.model_path, plan.profiles, settings)
        writer.models.append(ServedModel(plan.name, "model", dest / plan.name, ENGINE_PLATFORM))
    else:
        writer.add_onnx(plan.name, "model", plan.model_path, io, plan,
                        "KIND_GPU" if plan.gpu else "KIND_CPU")
    cpu_io = None
    if plan.fallback_cpu:
        assert plan.fallback_source is not None
        cpu_io = model_io_from_onnx(plan.fallback_source)
        if [t.name for t in cpu_io.inputs] != [t.name for t in io.inputs]:
            raise UserInputError(f"fallback ONNX {plan.fallback_source} has other inputs than "
                                 "the model")
        writer.add_onnx(f"{plan.name}_cpu", "cpu_fallback", plan.fallback_source, cpu_io, plan,
                        "KIND_CPU")
    if text is not None:
        _write_text_models(writer, plan, io, cpu_io, *text)
    if writer.problems:  # trtpack wrote configs that disagree with the model: a bug
        raise RuntimeError("model repository checks failed:\n  " + "\n  ".join(writer.problems))
    repo = ModelRepository(dest, writer.models, writer.warnings)
    if plan.tuning_dir is not None:
        from trtpack.serving.tuning import write_tuning_files

        repo.tuning_files = write_tuning_files(plan.tuning_dir, repo, plan.profiles, settings,
                                               plan.repository_ref, plan.tuning_cases)
    return repo


def _check_plan(dest: Path, plan: RepositoryPlan) -> None:
    """What the files must provide, checked before anything is written."""
    if not plan.profiles:
        raise UserInputError("a model repository needs at least one shape profile")
    if not plan.model_path.is_file():
        raise UserInputError(f"model file {plan.model_path} does not exist")
    if plan.serve == "text" and not has_tokenizer(plan.tokenizer_dir):
        raise UserInputError(
            f"--serve text: no tokenizer files in {plan.tokenizer_dir} "
            f"(expected one of {', '.join(VOCABULARY_FILES)})"
        )
    if plan.tuning_dir is not None and plan.tuning_dir.resolve().is_relative_to(dest.resolve()):
        raise UserInputError("tuning_dir must be outside the model repository")
    source = plan.fallback_source
    if plan.fallback_cpu and (source is None or not source.is_file()):
        raise UserInputError(f"--fallback-cpu needs the FP32 ONNX model; got {source}")
    _check_no_conflict(dest)


def _served_io(plan: RepositoryPlan) -> ModelIO:
    """The served model's I/O: the engine's (from its provenance) or the ONNX's."""
    if not plan.engine:
        return model_io_from_onnx(plan.model_path)
    prov = provenance_path(plan.model_path)
    if not prov.is_file():
        raise UserInputError(f"{plan.model_path} has no {prov.name}: the engine's I/O is unknown")
    return EngineProvenance.load(prov).model_io()


def _write_text_models(writer: RepositoryWriter, plan: RepositoryPlan, io: ModelIO,
                       cpu_io: ModelIO | None, fields: dict[str, TokenField],
                       post: Postprocessing | None) -> None:
    """``--serve text``: the tokenizer, the post-processing (when the task has one) and an
    ensemble over the model (and over ``<name>_cpu``, when its I/O is the model's)."""
    assert plan.tokenizer_dir is not None
    name, profiles, settings = plan.name, plan.profiles, plan.settings
    tok_name, post_name = f"{name}_tokenizer", f"{name}_postprocess"
    info = prepare_tokenizer(plan.tokenizer_dir,
                             writer.dest / tok_name / VERSION / TOKENIZER_FOLDER)
    seq = sequence_range(fields, profiles, info.model_max_length)
    tok_config = tokenizer_config(tok_name, io, fields, profiles, settings, seq,
                                  info.pad_id, info.padding_side, info.truncation_side)
    tok_version = writer.add(tok_name, "tokenizer", "python", tok_config)
    shutil.copyfile(TEMPLATES_DIR / "tokenizer.py", tok_version / "model.py")
    not_carried = vendor_tokenizers(tok_version / VENDOR_FOLDER)
    if not_carried is not None:
        writer.warnings.append(not_carried)
    if post is not None:
        post_config = postprocess_config(post_name, post, profiles, settings)
        post_version = writer.add(post_name, "postprocess", "python", post_config)
        shutil.copyfile(TEMPLATES_DIR / "postprocess.py", post_version / "model.py")
        if post.labels:
            (post_version / LABELS_FILE).write_text(json.dumps(list(post.labels)),
                                                    encoding="utf-8")
    targets = [(name, f"{name}_ensemble")]
    if cpu_io is not None and _same_io(cpu_io, io):
        targets.append((f"{name}_cpu", f"{name}_cpu_ensemble"))
    elif cpu_io is not None:
        writer.warnings.append(f"no {name}_cpu_ensemble: the FP32 ONNX's I/O types differ "
                               "from the engine's, so one tokenizer cannot feed both")
    for model_name, ensemble_name in targets:
        steps = text_ensemble_steps(tok_name, model_name, io, fields,
                                    post_name if post else None, post)
        outputs = post.outputs if post is not None else io.outputs
        e_io = ModelIO(tokenizer_io(io, fields).inputs, tuple(outputs))
        e_config = ensemble_config(ensemble_name, e_io, profiles, settings, steps)
        writer.add(ensemble_name, "ensemble", "ensemble", e_config, tuple(s.model for s in steps))
        writer.problems += check_ensemble(writer.dest, ensemble_name)
