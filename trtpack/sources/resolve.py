"""MODEL on the command line -> a recipe, in this order:

    recipe name -> recipe file -> ONNX file -> Hugging Face directory -> ``org/name`` id in
    the local Hugging Face cache (never downloaded; ``HF_HUB_OFFLINE`` or not)

A file is told apart by its content, not only its name: a ``.onnx`` holding text, a damaged
or truncated ONNX, an ONNX whose external data is missing, and a file that is neither ONNX
nor YAML are each a one-line error (exit 2). An ONNX file's recipe comes from its graph
(``trtpack.sources.onnx_recipe``), a model directory's from its config.json
(``trtpack.sources.hf_recipe``).
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from trtpack.errors import UserInputError
from trtpack.sources.heads import tasks
from trtpack.sources.onnx_recipe import recipe_for_onnx
from trtpack.sources.recipe import Recipe, safe_name
from trtpack.sources.recipe_files import (
    RECIPE_SUFFIXES,
    RECIPES_DIR,
    builtin_recipe_names,
    load_recipe_file,
)

ONNX_SUFFIX = ".onnx"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model(model: str, task: str | None = None) -> Recipe:
    """The recipe for MODEL; ``task`` (``--task``) picks the head of a model directory, a
    hub id or an ONNX file."""
    if task is not None and task not in tasks():
        raise UserInputError(f"unknown --task '{task}'; choose one of {', '.join(tasks())}")
    path = Path(model).expanduser()
    if "/" not in model and (RECIPES_DIR / f"{model}.yaml").is_file():
        return _no_task(load_recipe_file(RECIPES_DIR / f"{model}.yaml"), task, model)
    if path.is_file():
        return _from_file(path, task)
    if path.is_dir():
        from trtpack.sources.hf_recipe import recipe_for_hf_dir

        return recipe_for_hf_dir(path, task).with_origin(path)
    if path.suffix in RECIPE_SUFFIXES:
        raise UserInputError(f"recipe file '{model}' does not exist")
    if path.suffix == ONNX_SUFFIX:
        raise UserInputError(f"ONNX file '{model}' does not exist")
    if _names_a_path(model):
        raise UserInputError(f"'{model}' does not exist (no such file or folder)",
                             hint=_nearest_existing(path))
    if _HUB_ID.match(model):
        from trtpack.sources.hf_recipe import recipe_for_hf_dir

        folder = hub_cache_directory(model)
        return recipe_for_hf_dir(folder, task, name=hub_name(model)).with_origin(folder)
    if re.match(r"^[A-Za-z0-9][\w.-]*$", model):  # a bare hub id ("gpt2"), if cached
        folder_or_none = cached_snapshot(model)
        if folder_or_none is not None:
            from trtpack.sources.hf_recipe import recipe_for_hf_dir

            return recipe_for_hf_dir(folder_or_none, task, name=hub_name(model)
                                     ).with_origin(folder_or_none)
    names = builtin_recipe_names()
    close = difflib.get_close_matches(model.lower(), names, n=1, cutoff=0.6)
    raise UserInputError(
        f"unknown model '{model}': not a recipe name, a recipe file, an ONNX file, a model "
        f"directory or a Hugging Face id; known recipes: {', '.join(names)}",
        hint=f"did you mean '{close[0]}'?" if close else None)


def _names_a_path(model: str) -> bool:
    """MODEL written as a path (``/a/b``, ``./m``, ``~/m``, ``models/bert/``, ``a/b/c``), not
    a recipe name or an ``org/name`` hub id."""
    return (model.startswith(("/", "./", "../", "~")) or model.endswith("/")
            or model.count("/") > 1)


def _nearest_existing(path: Path) -> str | None:
    """A hint naming the deepest folder of ``path`` that exists, when it is not the root."""
    parent = next((p for p in path.absolute().parents if p.is_dir()), None)
    if parent is None or parent == Path(parent.anchor):
        return None
    return f"'{parent}' exists; check the rest of the path"


def _no_task(recipe: Recipe, task: str | None, model: str) -> Recipe:
    if task is not None and task != recipe.task:
        raise UserInputError(
            f"--task applies to model directories, hub ids and ONNX files; recipe '{model}' "
            f"is task {recipe.task} (its outputs are in the recipe: edit task: and outputs:)")
    return recipe


def _looks_like_text(head: bytes) -> bool:
    if not head:
        return True
    if b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:  # a multi-byte character cut at the end is still text
        return e.start >= len(head) - 3
    return True


def _from_file(path: Path, task: str | None) -> Recipe:
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise UserInputError(f"cannot read '{path}': {e.strerror}") from None
    text = _looks_like_text(head)
    if path.suffix == ONNX_SUFFIX:
        if text:
            raise UserInputError(
                f"'{path}' is named .onnx but holds text, not an ONNX model; if it is a "
                "recipe, name it .yaml")
        return recipe_for_onnx(path, task).with_origin(path)
    if path.suffix in RECIPE_SUFFIXES or text:
        if not text:
            raise UserInputError(f"'{path}' is binary, not a recipe YAML file")
        return _no_task(load_recipe_file(path), task, str(path))
    if not _is_protobuf(head):
        raise UserInputError(f"'{path}' is neither a recipe YAML file nor an ONNX model")
    return recipe_for_onnx(path, task).with_origin(path)


def _is_protobuf(head: bytes) -> bool:
    """An ONNX ModelProto starts with a field tag: ir_version (0x08) in every exporter's
    output, or another of its fields (wire types 0 or 2, field numbers 1-20)."""
    if not head:
        return False
    field, wire = head[0] >> 3, head[0] & 7
    return 1 <= field <= 20 and wire in (0, 2)


def hub_name(model_id: str) -> str:
    """The recipe name of a hub id: its last part (not the snapshot's commit hash)."""
    return safe_name(model_id.split("/")[-1])


def cached_snapshot(model_id: str) -> Path | None:
    """The local Hugging Face cache's snapshot of ``model_id`` (None: not there)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    try:
        return Path(snapshot_download(model_id, local_files_only=True))
    except Exception:  # not cached (huggingface_hub raises several kinds)
        return None


def hub_cache_directory(model_id: str) -> Path:
    """The local snapshot of a Hugging Face id; nothing is downloaded."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        raise UserInputError(f"'{model_id}' is not a recipe, file or directory, and "
                             "huggingface_hub is not installed to look in its cache") from None
    try:
        folder = snapshot_download(model_id, local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError):
        from huggingface_hub.constants import HF_HUB_CACHE

        raise UserInputError(
            f"'{model_id}' is not in the local Hugging Face cache ({HF_HUB_CACHE}); trtpack "
            "does not download models: fetch it first (huggingface-cli download "
            f"{model_id}) or give a local directory") from None
    return Path(folder)
