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
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    from trtpack.cases import Case


def _same_io(a: ModelIO, b: ModelIO) -> bool:
    def sig(io: ModelIO) -> list[tuple[str, str, int]]:
        return [(t.name, t.dtype, len(t.shape)) for t in (*io.inputs, *io.outputs)]

    return sig(a) == sig(b)


def _check_no_conflict(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UserInputError(f"model repository destination {dest} exists and is not empty")


def write_model_repository(
    dest: Path,
    *,
    recipe: Recipe,
    profiles: Sequence[ShapeProfile],
    model_path: Path,
    gpu: bool = False,
    serve: Serve = "tensor",
    fallback_cpu: bool = False,
    fallback_onnx: Path | None = None,
    tokenizer_dir: Path | None = None,
    model_config_json: Path | None = None,
    settings: TritonSettings | None = None,
    name: str | None = None,
    tuning_dir: Path | None = None,
    repository_ref: str | None = None,
    tuning_cases: Sequence[Case] = (),
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
    pass e.g. ``"../model_repository"`` when both are written under temporary names);
    ``tuning_cases``, the verified inputs, are written there for perf_analyzer to send.
    Which ``serve`` / ``fallback_cpu`` combinations a build may ask for is decided once, by
    ``api.resolve_options``; this checks only what the files themselves must provide.
    """
    settings = settings or recipe.triton
    name = name or recipe.name
    if not profiles:
        raise UserInputError("a model repository needs at least one shape profile")
    if not model_path.is_file():
        raise UserInputError(f"model file {model_path} does not exist")
    engine = model_path.suffix == ".plan"
    if serve == "text" and not has_tokenizer(tokenizer_dir):
        raise UserInputError(
            f"--serve text: no tokenizer files in {tokenizer_dir} "
            f"(expected one of {', '.join(VOCABULARY_FILES)})"
        )
    if tuning_dir is not None and tuning_dir.resolve().is_relative_to(dest.resolve()):
        raise UserInputError("tuning_dir must be outside the model repository")
    fallback_src = fallback_onnx or (None if engine else model_path)
    if fallback_cpu and (fallback_src is None or not fallback_src.is_file()):
        raise UserInputError(f"--fallback-cpu needs the FP32 ONNX model; got {fallback_src}")
    _check_no_conflict(dest)

    if engine:
        prov = provenance_path(model_path)
        if not prov.is_file():
            raise UserInputError(f"{model_path} has no {prov.name}: the engine's I/O is unknown")
        io = EngineProvenance.load(prov).model_io()
    else:
        io = model_io_from_onnx(model_path)
    fields: dict[str, TokenField] = {}
    post: Postprocessing | None = None
    if serve == "text":
        fields = token_fields(recipe, io)
        post = postprocessing(recipe, io, fields, model_config_json, tokenizer_dir)

    warnings: list[str] = []
    if settings.cuda_graphs and not engine:
        warnings.append("cuda_graphs is a TensorRT option; this repository has no engine")
    elif settings.cuda_graphs and not shared_graph_shapes(profiles):
        warnings.append(CUDA_GRAPHS_NOT_WRITTEN)
    dest.mkdir(parents=True, exist_ok=True)
    models: list[ServedModel] = []

    def write(model_name: str, role: Role, backend: str, config: Any,
              members: tuple[str, ...] = ()) -> Path:
        model_dir = dest / model_name
        (model_dir / VERSION).mkdir(parents=True, exist_ok=True)
        write_config(model_dir / CONFIG_FILE, config)
        models.append(ServedModel(model_name, role, model_dir, backend, members))
        return model_dir / VERSION

    problems: list[str] = []
    if engine:
        write_engine_model(dest, name, model_path, profiles, settings)  # checks its config
        models.append(ServedModel(name, "model", dest / name, ENGINE_PLATFORM))
    else:
        kind: InstanceKind = "KIND_GPU" if gpu else "KIND_CPU"
        main_config = onnx_model_config(name, io, profiles, settings, kind)
        copy_onnx(model_path, write(name, "model", ONNX_PLATFORM, main_config))
        problems += check_config(main_config, io)

    cpu_name = f"{name}_cpu"
    if fallback_cpu:
        assert fallback_src is not None
        cpu_io = model_io_from_onnx(fallback_src)
        if [t.name for t in cpu_io.inputs] != [t.name for t in io.inputs]:
            raise UserInputError(f"fallback ONNX {fallback_src} has other inputs than the model")
        cpu_config = onnx_model_config(cpu_name, cpu_io, profiles, settings, "KIND_CPU")
        copy_onnx(fallback_src, write(cpu_name, "cpu_fallback", ONNX_PLATFORM, cpu_config))
        problems += check_config(cpu_config, cpu_io)

    if serve == "text":
        assert tokenizer_dir is not None
        tok_name, post_name = f"{name}_tokenizer", f"{name}_postprocess"
        info = prepare_tokenizer(tokenizer_dir, dest / tok_name / VERSION / TOKENIZER_FOLDER)
        seq = sequence_range(fields, profiles, info.model_max_length)
        tok_config = tokenizer_config(tok_name, io, fields, profiles, settings, seq,
                                      info.pad_id, info.padding_side, info.truncation_side)
        tok_version = write(tok_name, "tokenizer", "python", tok_config)
        shutil.copyfile(TEMPLATES_DIR / "tokenizer.py", tok_version / "model.py")
        not_carried = vendor_tokenizers(tok_version / VENDOR_FOLDER)
        if not_carried is not None:
            warnings.append(not_carried)
        if post is not None:
            post_config = postprocess_config(post_name, post, profiles, settings)
            post_version = write(post_name, "postprocess", "python", post_config)
            shutil.copyfile(TEMPLATES_DIR / "postprocess.py", post_version / "model.py")
            if post.labels:
                (post_version / LABELS_FILE).write_text(json.dumps(list(post.labels)),
                                                        encoding="utf-8")
        targets = [(name, f"{name}_ensemble")]
        if fallback_cpu and _same_io(cpu_io, io):
            targets.append((cpu_name, f"{name}_cpu_ensemble"))
        elif fallback_cpu:
            warnings.append(f"no {name}_cpu_ensemble: the FP32 ONNX's I/O types differ from "
                            "the engine's, so one tokenizer cannot feed both")
        for model_name, ensemble_name in targets:
            steps = text_ensemble_steps(tok_name, model_name, io, fields,
                                        post_name if post else None, post)
            outputs = post.outputs if post is not None else io.outputs
            e_io = ModelIO(tokenizer_io(io, fields).inputs, tuple(outputs))
            e_config = ensemble_config(ensemble_name, e_io, profiles, settings, steps)
            write(ensemble_name, "ensemble", "ensemble", e_config,
                  tuple(s.model for s in steps))
            problems += check_ensemble(dest, ensemble_name)

    if problems:  # trtpack wrote configs that disagree with the model: a bug, not user input
        raise RuntimeError("model repository checks failed:\n  " + "\n  ".join(problems))
    repo = ModelRepository(dest, models, warnings)
    if tuning_dir is not None:
        from trtpack.serving.tuning import write_tuning_files

        repo.tuning_files = write_tuning_files(tuning_dir, repo, profiles, settings,
                                               repository_ref, tuning_cases)
    return repo
