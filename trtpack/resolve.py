"""MODEL on the command line -> a recipe, in this order:

    recipe name -> recipe file -> ONNX file -> Hugging Face directory -> ``org/name`` id in
    the local Hugging Face cache (never downloaded; ``HF_HUB_OFFLINE`` or not)

A file is told apart by its content, not only its name: a ``.onnx`` holding text, a damaged
or truncated ONNX, an ONNX whose external data is missing, and a file that is neither ONNX
nor YAML are each a one-line error (exit 2). An ONNX file's recipe comes from its graph:
inputs, outputs, dtypes and dynamic axes, named as in the graph, except that unnamed dynamic
dims are ``dim_K`` (K the dimension's position), a dynamic first dimension of every input is
``batch`` (Triton batches over it), and token inputs (ids, mask, types) share the first
one's axes (one tokenizer makes them). onnx is imported inside the functions.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from trtpack.errors import UserInputError
from trtpack.recipe import (
    RECIPES_DIR,
    TASKS,
    Recipe,
    builtin_recipe_names,
    load_recipe_file,
    safe_name,
)
from trtpack.tokenizer_files import has_tokenizer

ONNX_SUFFIX = ".onnx"
BATCH = "batch"
RECIPE_SUFFIXES = (".yaml", ".yml")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model(model: str, task: str | None = None) -> Recipe:
    """The recipe for MODEL; ``task`` (``--task``) picks the head of a model directory, a
    hub id or an ONNX file."""
    if task is not None and task not in TASKS:
        raise UserInputError(f"unknown --task '{task}'; choose one of {', '.join(TASKS)}")
    path = Path(model).expanduser()
    if "/" not in model and (RECIPES_DIR / f"{model}.yaml").is_file():
        return _no_task(load_recipe_file(RECIPES_DIR / f"{model}.yaml"), task, model)
    if path.is_file():
        return _from_file(path, task)
    if path.is_dir():
        from trtpack.heads import recipe_for_hf_dir

        return recipe_for_hf_dir(path, task).with_origin(path)
    if path.suffix in RECIPE_SUFFIXES:
        raise UserInputError(f"recipe file '{model}' does not exist")
    if path.suffix == ONNX_SUFFIX:
        raise UserInputError(f"ONNX file '{model}' does not exist")
    if _HUB_ID.match(model):
        from trtpack.heads import recipe_for_hf_dir

        folder = hub_cache_directory(model)
        return recipe_for_hf_dir(folder, task, name=hub_name(model)).with_origin(folder)
    if re.match(r"^[A-Za-z0-9][\w.-]*$", model):  # a bare hub id ("gpt2"), if cached
        folder_or_none = _cached_snapshot(model)
        if folder_or_none is not None:
            from trtpack.heads import recipe_for_hf_dir

            return recipe_for_hf_dir(folder_or_none, task, name=hub_name(model)
                                     ).with_origin(folder_or_none)
    raise UserInputError(
        f"unknown model '{model}': not a recipe name, a recipe file, an ONNX file, a model "
        f"directory or a Hugging Face id; known recipes: {', '.join(builtin_recipe_names())}"
    )


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


def _cached_snapshot(model_id: str) -> Path | None:
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


# --- ONNX in --------------------------------------------------------------------------------

_ELEM_TO_DTYPE = {1: "float32", 6: "int32", 7: "int64", 10: "float16"}


def load_onnx_graph(path: Path) -> Any:
    """The ModelProto without its weights, checked: a damaged file, a truncated one, or
    missing external data is a one-line ``UserInputError``."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserInputError(f"'{path}' is not a readable ONNX model (damaged or truncated: "
                             f"{first})") from None
    if not model.graph.node or not model.graph.output or not model.opset_import:
        raise UserInputError(f"'{path}' is not a complete ONNX model (no graph, outputs or "
                             "opset: damaged or truncated?)")
    check_external_data(model, path)
    try:
        onnx.checker.check_model(str(path))  # external data resolved beside the file
    except onnx.checker.ValidationError as e:
        first = (str(e).strip().splitlines() or ["invalid"])[0]
        raise UserInputError(f"'{path}' is not a valid ONNX model: {first}") from None
    return model


def external_tensors(model: Any) -> list[Any]:
    import onnx

    tensors = list(model.graph.initializer)
    for node in model.graph.node:
        tensors.extend(a.t for a in node.attribute if a.HasField("t"))
    return [t for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL]


def check_external_data(model: Any, path: Path) -> None:
    """Every external weight's file exists beside the model and holds its bytes."""
    sizes: dict[str, int] = {}
    for t in external_tensors(model):
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        data = path.parent / location
        if location not in sizes:
            if not location or not data.is_file():
                raise UserInputError(
                    f"'{path}' keeps its weights in external data '{location}', which is "
                    f"missing beside it (expected {data})")
            sizes[location] = data.stat().st_size
        end = int(info.get("offset", 0) or 0) + int(info.get("length", 0) or 0)
        if end > sizes[location]:
            raise UserInputError(
                f"'{path}': external data '{location}' is {sizes[location]} bytes, but "
                f"tensor '{t.name}' needs bytes up to {end} (truncated?)")


def _dims(value: Any, unnamed: list[int]) -> list[str | int]:
    """A tensor's dims: sizes, names, and ``dim_K`` for unnamed dynamic ones (K counts
    them over the model, ``unnamed`` holds the count)."""
    axes: list[str | int] = []
    for d in value.type.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            axes.append(int(d.dim_value))
        elif d.dim_param:
            axes.append(d.dim_param)
        else:
            axes.append(f"dim_{unnamed[0]}")
            unnamed[0] += 1
    return axes


def _input_kind(name: str, dtype: str, rank: int) -> str:
    lowered = name.lower()
    if dtype.startswith("int"):
        if "mask" in lowered:
            return "attention_mask"
        if "type" in lowered or "segment" in lowered:
            return "token_type_ids"
        if "ids" in lowered or "token" in lowered or "input" in lowered:
            return "token_ids"
    if dtype.startswith("float") and rank == 4:
        return "image"
    return "generic"


def _output_metric(name: str, axes: list[str | int], task: str, has_mask: bool) -> str:
    from trtpack.heads import text_outputs

    for out in text_outputs(task) if task not in ("generic", "image-classification") else []:
        if out["name"] == name:
            return str(out["metric"])
    if task == "image-classification" and name == "logits":
        return "top1"
    if len(axes) == 3 and has_mask:
        return "pooled_cosine"
    return "cosine"


def _shared_axes(inputs: list[dict[str, Any]]) -> dict[str, str]:
    """Name the axes inputs share, in place: a dynamic first dimension of every input is
    ``batch`` (Triton batches over it), and token inputs (ids, mask, types: one tokenizer
    output) share the first one's axes. Returns the renames (old name -> new)."""
    renames: dict[str, str] = {}
    if all(spec["axes"] and isinstance(spec["axes"][0], str) for spec in inputs):
        for spec in inputs:
            renames[spec["axes"][0]] = BATCH
            spec["axes"][0] = BATCH
    tokens = [s for s in inputs if s["kind"] in ("token_ids", "attention_mask", "token_type_ids")]
    for spec in tokens[1:]:
        if len(spec["axes"]) == len(tokens[0]["axes"]):
            for d, (mine, first) in enumerate(zip(spec["axes"], tokens[0]["axes"],
                                                   strict=True)):
                if isinstance(mine, str) and isinstance(first, str) and mine != first:
                    renames[mine] = first
                    spec["axes"][d] = first
    return renames


def _task_from_config(folder: Path) -> str | None:
    config = folder / "config.json"
    if not config.is_file():
        return None
    from trtpack.heads import head_of_architecture, read_config

    archs = read_config(folder).get("architectures") or []
    head = head_of_architecture(archs[0]) if archs else None
    return head.task if head is not None else None


def _default_profile(inputs: list[dict[str, Any]], max_sequence: int = 128) -> str:
    """Sizes per dynamic axis in order: the first axis is a batch (1:4:8), an axis of token
    inputs a sequence (16:64:128, capped at ``max_sequence``), other dynamic axes 1:2:4."""
    sizes: dict[str, tuple[int, int, int]] = {}
    for spec in inputs:
        for d, axis in enumerate(spec["axes"]):
            if isinstance(axis, int) or axis in sizes:
                continue
            if d == 0:
                sizes[axis] = (1, 4, 8)
            elif spec["kind"] in ("token_ids", "attention_mask", "token_type_ids"):
                top = max(1, min(128, max_sequence))
                sizes[axis] = (min(16, top), min(64, top), top)
            elif spec["kind"] == "image":
                sizes[axis] = (224, 224, 224)
            else:
                sizes[axis] = (1, 2, 4)
    if not sizes:
        return "x".join(str(a) for a in inputs[0]["axes"])
    return ":".join("x".join(str(v[i]) for v in sizes.values()) for i in range(3))


def recipe_for_onnx(path: Path, task: str | None = None) -> Recipe:
    """The recipe for an ONNX file: I/O, dtypes and dynamic axes from its graph."""
    model = load_onnx_graph(path)
    initializers = {t.name for t in model.graph.initializer}
    unnamed = [0]
    inputs: list[dict[str, Any]] = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        elem = value.type.tensor_type.elem_type
        dtype = _ELEM_TO_DTYPE.get(elem)
        if dtype is None:
            raise UserInputError(f"'{path}': input '{value.name}' has ONNX element type {elem}; "
                                 "trtpack takes int64, int32, float32 and float16 inputs")
        axes = _dims(value, unnamed)
        inputs.append({"name": value.name, "dtype": dtype, "axes": axes,
                       "kind": _input_kind(value.name, dtype, len(axes))})
    if not inputs:
        raise UserInputError(f"'{path}' has no inputs to feed")
    renames = _shared_axes(inputs)
    folder = path.parent
    task = task or _task_from_config(folder) or "generic"
    has_mask = any(i["kind"] == "attention_mask" for i in inputs)
    outputs = []
    for v in model.graph.output:
        axes = [renames.get(a, a) if isinstance(a, str) else a for a in _dims(v, unnamed)]
        if axes and isinstance(axes[0], str) and BATCH in renames.values():
            axes[0] = BATCH
        outputs.append({"name": v.name, "axes": axes,
                        "metric": _output_metric(v.name, axes, task, has_mask)})
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 18)
    vocab: int | None = None
    max_sequence = 128
    if (folder / "config.json").is_file():
        from trtpack.heads import read_config

        config = read_config(folder)
        size = config.get("vocab_size")
        vocab = int(size) if isinstance(size, int) and size > 1 else None
        positions = config.get("max_position_embeddings") or config.get("n_positions")
        max_sequence = int(positions) if isinstance(positions, int) else max_sequence
    recipe = {
        "name": safe_name(path.stem),
        "description": f"ONNX model {path.name} (recipe inferred from its graph)",
        "task": task,
        "source": {"onnx": str(path.resolve())},
        "tokenizer": has_tokenizer(folder),
        "vocab_size": vocab,
        "inputs": inputs,
        "outputs": outputs,
        "opset": min(max(int(opset), 13), 23),
        "profiles": [_default_profile(inputs, max_sequence)],
    }
    return Recipe.model_validate(recipe)
