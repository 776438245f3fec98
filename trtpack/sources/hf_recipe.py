"""The recipe for a local Hugging Face model directory (a sentence-transformers one too):
its head from ``config.architectures`` or ``--task`` (``trtpack.sources.heads``), its inputs,
outputs and profile from ``config.json``."""

from __future__ import annotations

import json
from pathlib import Path

from trtpack.errors import UserInputError
from trtpack.report import JsonObject, JsonValue
from trtpack.sources.architectures import (
    config_int,
    hidden_size,
    image_size,
    max_positions,
    pooler_axes,
    takes_token_type_ids,
    vocab_size,
)
from trtpack.sources.heads import (
    class_for_task,
    head_for,
    head_of_architecture,
    supported,
    text_outputs,
)
from trtpack.sources.recipe import Recipe, safe_name
from trtpack.sources.tokenizer_files import has_tokenizer


def read_config(path: Path) -> dict[str, JsonValue]:
    try:
        data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UserInputError(f"cannot read {path / 'config.json'}: {e}") from None
    if not isinstance(data, dict):
        raise UserInputError(f"{path / 'config.json'} is not a JSON object")
    return data


def _sentence_transformers(path: Path) -> tuple[Path, dict[str, str | bool]] | None:
    """(the transformer's folder, pooling settings) of a sentence-transformers directory."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return None
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UserInputError(f"cannot read {modules_file}: {e}") from None
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise UserInputError(f"{modules_file} is not a list of modules (JSON objects with "
                             "type and path)")
    transformer = path
    pooling: dict[str, str | bool] = {"mode": "mean", "normalize": False}
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        folder = path / str(module.get("path", ""))
        if kind == "Transformer":
            transformer = folder
        elif kind == "Pooling":
            settings = _pooling_settings(folder / "config.json")
            modes = [m for m, key in (("cls", "pooling_mode_cls_token"),
                                      ("mean", "pooling_mode_mean_tokens"),
                                      ("max", "pooling_mode_max_tokens"),
                                      ("lasttoken", "pooling_mode_lasttoken"))
                     if settings.get(key)]
            unsupported = [k for k in ("pooling_mode_mean_sqrt_len_tokens",
                                       "pooling_mode_weightedmean_tokens") if settings.get(k)]
            if unsupported or len(modes) > 1:
                raise UserInputError(
                    f"{folder}: pooling {', '.join(unsupported + modes)} is not supported; "
                    "trtpack pools with one of cls, mean, max, lasttoken")
            pooling["mode"] = modes[0] if modes else "mean"
        elif kind == "Normalize":
            pooling["normalize"] = True
        else:
            raise UserInputError(
                f"{modules_file}: sentence-transformers module '{kind}' is not supported "
                "(Transformer, Pooling and Normalize are); use --task feature-extraction "
                "for the token embeddings")
    return transformer, pooling


def _pooling_settings(config_file: Path) -> dict[str, JsonValue]:
    """The Pooling module's config.json ({} when there is none)."""
    if not config_file.is_file():
        return {}
    try:
        settings = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UserInputError(f"cannot read {config_file}: {e}") from None
    if not isinstance(settings, dict):
        raise UserInputError(f"{config_file} is not a JSON object")
    return settings


def _is_vision(config: JsonObject, task: str) -> bool:
    if task == "image-classification":
        return True
    if "vocab_size" in config or task not in ("feature-extraction",):
        return False
    return "num_channels" in config or "image_size" in config or "pixel_values" in json.dumps(
        config)


def recipe_for_hf_dir(path: Path, task: str | None = None, name: str | None = None) -> Recipe:
    """The recipe for a local Hugging Face directory (a sentence-transformers one too), named
    ``name`` or else after the folder."""
    if not path.is_dir():
        raise UserInputError(f"'{path}' is not a directory")
    st = _sentence_transformers(path) if task in (None, "sentence-embedding") else None
    model_dir = st[0] if st is not None else path
    if not (model_dir / "config.json").is_file():
        raise UserInputError(
            f"'{path}' is a directory without config.json: not a Hugging Face model directory")
    config = read_config(model_dir)
    if config.get("is_encoder_decoder"):
        raise UserInputError(
            f"{model_dir}: encoder-decoder models ({config.get('model_type')}) are not "
            f"supported; trtpack builds these heads: {supported()}")
    model_type = str(config.get("model_type", ""))
    listed = config.get("architectures")
    archs = [str(a) for a in listed] if isinstance(listed, list) else []
    model_class: str | None
    if task == "sentence-embedding" and st is None:
        raise UserInputError(f"--task sentence-embedding needs a sentence-transformers "
                             f"directory (modules.json), and {path} has none")
    if st is not None:
        task, model_class = "sentence-embedding", "AutoModel"
    elif task is not None:
        head = head_for(task)
        model_class = class_for_task(model_type, task) if model_type else \
            head.auto_class if head is not None else None
        if model_class is None:
            raise UserInputError(f"unknown task '{task}'; supported: {supported()}")
    elif archs:
        head = head_of_architecture(archs[0])
        if head is None:
            raise UserInputError(
                f"{model_dir}: architecture {archs[0]} is not supported; trtpack builds "
                f"these heads: {supported()} (pick one with --task)")
        task, model_class = head.task, archs[0]
    else:
        task, model_class = "feature-extraction", "AutoModel"
    recipe: dict[str, object] = {"name": name or safe_name(path.resolve().name), "task": task,
                              "model_class": model_class,
                              "source": {"path": str(model_dir.resolve())}}
    id2label = config.get("id2label")
    labels = (len(id2label) if isinstance(id2label, dict | list) else 0) or config_int(
        config.get("num_labels", 2))
    if _is_vision(config, task):
        size = image_size(config)
        recipe.update(
            inputs=[{"name": "pixel_values", "dtype": "float32", "kind": "image",
                     "axes": ["batch", config_int(config.get("num_channels", 3)), size, size]}],
            outputs=text_outputs(task, labels=labels) if task == "image-classification" else
            [{"name": "pooler_output", "axes": pooler_axes(config), "metric": "cosine"}],
            profiles=["1:4:8"])
        return Recipe.model_validate(recipe)
    hidden = hidden_size(config)
    vocab = vocab_size(config)
    inputs: list[dict[str, str | list[str]]] = [
        {"name": "input_ids", "dtype": "int64", "axes": ["batch", "sequence"], "kind": "token_ids"},
        {"name": "attention_mask", "dtype": "int64", "axes": ["batch", "sequence"],
         "kind": "attention_mask"},
    ]
    if takes_token_type_ids(config):
        inputs.append({"name": "token_type_ids", "dtype": "int64", "axes": ["batch", "sequence"],
                       "kind": "token_type_ids"})
    outputs = text_outputs(task, hidden=hidden, labels=labels, vocab=vocab)
    max_len = min(max_positions(config), 512)
    recipe.update(
        inputs=inputs, outputs=outputs, profiles=[f"1x16:4x64:8x{max_len}"],
        tokenizer=has_tokenizer(model_dir),
        vocab_size=vocab,
    )
    if st is not None:
        recipe["pooling"] = st[1]
    return Recipe.model_validate(recipe)
