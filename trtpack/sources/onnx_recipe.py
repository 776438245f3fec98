"""The recipe for an ONNX file, read from its graph: inputs, outputs, dtypes and dynamic
axes, named as in the graph, except that unnamed dynamic dims are ``dim_K`` (K the
dimension's position), a dynamic first dimension of every input is ``batch`` (Triton batches
over it), and token inputs (ids, mask, types) share the first one's axes (one tokenizer makes
them). onnx is imported inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from trtpack.errors import UserInputError, first_line
from trtpack.model_io import ONNX_ELEM_TO_NUMPY
from trtpack.shapes import BATCH_AXIS
from trtpack.sources.recipe import TOKENIZER_OUTPUTS, Recipe, safe_name
from trtpack.sources.tokenizer_files import has_tokenizer

if TYPE_CHECKING:
    import onnx


class GraphInput(TypedDict):
    """An input as the recipe takes it, read from the graph (its axes renamed in place)."""

    name: str
    dtype: str
    axes: list[str | int]
    kind: str


INPUT_DTYPES_TAKEN = ("int64", "int32", "float32", "float16")  # an ONNX file's inputs
_ELEM_TO_DTYPE = {elem: dtype for elem, dtype in ONNX_ELEM_TO_NUMPY.items()
                  if dtype in INPUT_DTYPES_TAKEN}


def load_onnx_graph(path: Path) -> onnx.ModelProto:
    """The ModelProto without its weights, checked: a damaged file, a truncated one, or
    missing external data is a one-line ``UserInputError``."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError) as e:
        first = first_line(e)
        raise UserInputError(f"'{path}' is not a readable ONNX model (damaged or truncated: "
                             f"{first})") from None
    if not model.graph.node or not model.graph.output or not model.opset_import:
        raise UserInputError(f"'{path}' is not a complete ONNX model (no graph, outputs or "
                             "opset: damaged or truncated?)")
    check_external_data(model, path)
    try:
        check_graph(model, path)
    except onnx.checker.ValidationError as e:
        first = first_line(e, "invalid")
        raise UserInputError(f"'{path}' is not a valid ONNX model: {first}") from None
    except UnicodeDecodeError:  # the checker's message quotes bytes that are not UTF-8
        raise UserInputError(f"'{path}' is not a valid ONNX model (a name or field in it is "
                             "not UTF-8 text: damaged?)") from None
    return model


def check_graph(model: onnx.ModelProto, path: Path) -> None:
    """``onnx.checker`` on the model file, its external data resolved beside it. onnx refuses
    external data files with several hard links (trtpack's own artifacts are hard links into
    its stage cache): those are checked against sparse stand-ins of the same sizes in a
    temporary folder (``check_external_data`` has checked the real files' sizes)."""
    import tempfile

    import onnx

    locations = {e.value for t in external_tensors(model) for e in t.external_data
                 if e.key == "location"}
    if not any((path.parent / loc).stat().st_nlink > 1 for loc in locations):
        onnx.checker.check_model(str(path))
        return
    with tempfile.TemporaryDirectory(prefix="trtpack-check-") as tmp:
        model_copy = Path(tmp) / path.name
        model_copy.write_bytes(path.read_bytes())
        for loc in locations:
            stand_in = Path(tmp) / loc
            stand_in.parent.mkdir(parents=True, exist_ok=True)
            with open(stand_in, "wb") as f:
                f.truncate((path.parent / loc).stat().st_size)
        onnx.checker.check_model(str(model_copy))


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    import onnx

    from trtpack.onnx_tools.files import all_tensors

    return [t for t in all_tensors(model.graph)
            if t.data_location == onnx.TensorProto.EXTERNAL]


def check_external_data(model: onnx.ModelProto, path: Path) -> None:
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
        end = external_offset(info, "offset", t.name, path) + \
            external_offset(info, "length", t.name, path)
        if end > sizes[location]:
            raise UserInputError(
                f"'{path}': external data '{location}' is {sizes[location]} bytes, but "
                f"tensor '{t.name}' needs bytes up to {end} (truncated?)")


def external_offset(info: dict[str, str], key: str, tensor: str, path: Path) -> int:
    """The ``offset`` or ``length`` of an external-data entry (0 when absent), checked."""
    text = info.get(key) or "0"
    if not text.isascii() or not text.isdigit():
        raise UserInputError(f"'{path}': tensor '{tensor}' has external data {key} "
                             f"'{text[:40]}', not a byte count (damaged?)")
    return int(text)


def _dims(value: onnx.ValueInfoProto, unnamed: list[int]) -> list[str | int]:
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


def input_kind(name: str, dtype: str, rank: int) -> str:
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


def output_metric(name: str, axes: list[str | int], task: str, has_mask: bool) -> str:
    from trtpack.sources.heads import head_for

    head = head_for(task)
    for out in head.outputs if head is not None else ():
        if out.name == name:
            return out.metric
    if len(axes) == 3 and has_mask:
        return "pooled_cosine"
    if task == "generic" and not has_mask:
        return "scaled_error"  # boxes, maps, states: trtpack.verify.sample_metrics
    return "cosine"


def _shared_axes(inputs: list[GraphInput]) -> dict[str, str]:
    """Name the axes inputs share, in place: a dynamic first dimension of every input is
    ``batch`` (Triton batches over it), and token inputs (ids, mask, types: one tokenizer
    output) share the first one's axes. Returns the renames (old name -> new)."""
    renames: dict[str, str] = {}
    if all(spec["axes"] and isinstance(spec["axes"][0], str) for spec in inputs):
        for spec in inputs:
            renames[str(spec["axes"][0])] = BATCH_AXIS
            spec["axes"][0] = BATCH_AXIS
    tokens = [s for s in inputs if s["kind"] in TOKENIZER_OUTPUTS]
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
    from trtpack.sources.heads import head_of_architecture
    from trtpack.sources.hf_recipe import read_config

    archs = read_config(folder).get("architectures")
    head = head_of_architecture(str(archs[0])) if isinstance(archs, list) and archs else None
    return head.task if head is not None else None


DATA_DEPENDENT_OPS = ("NonZero", "NonMaxSuppression", "Unique", "Compress")
"""Operators whose output's shape depends on the values of their input."""


def data_dependent_tensors(graph: onnx.GraphProto) -> set[str]:
    """The tensors downstream of a ``DATA_DEPENDENT_OPS`` node (their shapes may depend on
    the data; conservative: everything computed from one)."""
    found: set[str] = set()
    for node in graph.node:  # ONNX graphs are topologically sorted
        if node.op_type in DATA_DEPENDENT_OPS or found.intersection(node.input):
            found.update(node.output)
    return found


def _default_profile(inputs: list[GraphInput], max_sequence: int = 128) -> str:
    """Sizes per dynamic axis in order: the first axis is a batch (1:4:8), an axis of token
    inputs a sequence (16:64:128, capped at ``max_sequence``), other dynamic axes 1:2:4."""
    sizes: dict[str, tuple[int, int, int]] = {}
    for spec in inputs:
        for d, axis in enumerate(spec["axes"]):
            if isinstance(axis, int) or axis in sizes:
                continue
            if d == 0:
                sizes[axis] = (1, 4, 8)
            elif spec["kind"] in TOKENIZER_OUTPUTS:
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
    inputs: list[GraphInput] = []
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
                       "kind": input_kind(value.name, dtype, len(axes))})
    if not inputs:
        raise UserInputError(f"'{path}' has no inputs to feed")
    renames = _shared_axes(inputs)
    folder = path.parent
    task = task or _task_from_config(folder) or "generic"
    has_mask = any(i["kind"] == "attention_mask" for i in inputs)
    outputs = []
    data_dependent = data_dependent_tensors(model.graph)
    for v in model.graph.output:
        axes = [renames.get(a, a) if isinstance(a, str) else a for a in _dims(v, unnamed)]
        if axes and isinstance(axes[0], str) and BATCH_AXIS in renames.values():
            axes[0] = BATCH_AXIS
        metric = "data_dependent" if v.name in data_dependent else \
            output_metric(v.name, axes, task, has_mask)
        outputs.append({"name": v.name, "axes": axes, "metric": metric})
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 18)
    vocab: int | None = None
    max_sequence = 128
    if (folder / "config.json").is_file():
        from trtpack.sources.hf_recipe import read_config

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
