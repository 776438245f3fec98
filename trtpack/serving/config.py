"""Triton ``config.pbtxt`` from a model's real I/O, through Triton's protobuf schema.

``ModelIO`` is the plain description of a model's tensors (from an ONNX file, an engine, or
a Python-backend model). ``model_config`` turns it plus the shape profiles and the recipe's
serving options into a ``ModelConfig`` message; ``write_config``/``read_config`` print and
parse it with ``google.protobuf.text_format``; ``check_config`` proves a config and a model
agree. tritonclient (the schema) and onnx are imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trtpack.errors import UserInputError
from trtpack.recipe import TritonSettings
from trtpack.shapes import BATCH_AXIS, ShapeProfile

NUMPY_TO_TRITON = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32", "uint64": "TYPE_UINT64", "int8": "TYPE_INT8",
    "int16": "TYPE_INT16", "int32": "TYPE_INT32", "int64": "TYPE_INT64",
    "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
    "bytes": "TYPE_STRING", "object": "TYPE_STRING", "bfloat16": "TYPE_BF16",
}
TRITON_TO_NUMPY = {v: k for k, v in NUMPY_TO_TRITON.items() if k != "object"}

InstanceKind = Literal["KIND_CPU", "KIND_GPU", "KIND_MODEL"]


@dataclass(frozen=True)
class TensorIO:
    """A served tensor: numpy dtype name and full shape; -1 marks a dynamic dimension.

    ``batch_dynamic`` says the first dimension is the batch (dynamic, shared by all tensors).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    batch_dynamic: bool = False


@dataclass(frozen=True)
class ModelIO:
    inputs: tuple[TensorIO, ...]
    outputs: tuple[TensorIO, ...]

    @property
    def all_batched(self) -> bool:
        return all(t.batch_dynamic for t in (*self.inputs, *self.outputs))


def _schema() -> Any:
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2


ONNX_ELEM_TO_NUMPY = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    8: "bytes", 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64",
    16: "bfloat16",
}


def model_io_from_onnx(path: Path, batch_axis: str = BATCH_AXIS) -> ModelIO:
    """The real I/O of an ONNX file (weights are not loaded)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}

    def tensor(value: Any) -> TensorIO:
        ttype = value.type.tensor_type
        dims = []
        for d in ttype.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") else -1)
        first = ttype.shape.dim[0] if ttype.shape.dim else None
        batch = first is not None and first.HasField("dim_param") and first.dim_param == batch_axis
        return TensorIO(value.name, ONNX_ELEM_TO_NUMPY.get(ttype.elem_type, "float32"),
                        tuple(dims), batch)

    inputs = tuple(tensor(v) for v in model.graph.input if v.name not in initializers)
    outputs = tuple(tensor(v) for v in model.graph.output)
    return ModelIO(inputs, outputs)


def max_batch_size(io: ModelIO, profiles: Sequence[ShapeProfile]) -> int:
    """The smallest profile max batch when every tensor has a dynamic batch dimension, else 0."""
    if not io.all_batched or not profiles:
        return 0
    return min(p.axis_range(0)[2] for p in profiles)


def preferred_batch_sizes(profiles: Sequence[ShapeProfile], limit: int) -> list[int]:
    return sorted({p.axis_range(0)[1] for p in profiles if p.axis_range(0)[1] <= limit})


def _dims(t: TensorIO, batched: bool) -> list[int]:
    return list(t.shape[1:] if batched else t.shape)


def model_config(
    name: str,
    io: ModelIO,
    profiles: Sequence[ShapeProfile],
    settings: TritonSettings,
    *,
    platform: str | None = None,
    backend: str | None = None,
    kind: InstanceKind = "KIND_CPU",
    profile_names: Sequence[str] = (),
    default_model_filename: str | None = None,
    batching: bool = True,
) -> Any:
    """A ``ModelConfig`` message for one model, derived from its real I/O."""
    pb = _schema()
    config = pb.ModelConfig(name=name)
    if platform:
        config.platform = platform
    if backend:
        config.backend = backend
    if default_model_filename:
        config.default_model_filename = default_model_filename
    mbs = max_batch_size(io, profiles) if batching else 0
    config.max_batch_size = mbs
    batched = mbs > 0
    for t in io.inputs:
        config.input.add(name=t.name, data_type=_triton_type(t), dims=_dims(t, batched))
    for t in io.outputs:
        config.output.add(name=t.name, data_type=_triton_type(t), dims=_dims(t, batched))
    group = config.instance_group.add(kind=getattr(pb.ModelInstanceGroup, kind),
                                      count=settings.instance_count)
    group.profile.extend(profile_names)
    if batched:
        config.dynamic_batching.max_queue_delay_microseconds = settings.max_queue_delay_us
        config.dynamic_batching.preferred_batch_size.extend(preferred_batch_sizes(profiles, mbs))
    if settings.version_policy == "all":
        config.version_policy.all.SetInParent()
    else:
        config.version_policy.latest.num_versions = 1
    if settings.response_cache:
        config.response_cache.enable = True
    return config


def _triton_type(t: TensorIO) -> int:
    pb = _schema()
    if t.dtype not in NUMPY_TO_TRITON:
        raise UserInputError(f"tensor '{t.name}' has dtype {t.dtype}, which Triton cannot serve")
    return int(pb.DataType.Value(NUMPY_TO_TRITON[t.dtype]))


def config_text(config: Any) -> str:
    from google.protobuf import text_format

    return str(text_format.MessageToString(config))


def write_config(path: Path, config: Any) -> None:
    path.write_text(config_text(config), encoding="utf-8")


def read_config(path: Path) -> Any:
    """Parse a ``config.pbtxt`` with Triton's schema (raises ``UserInputError`` if invalid)."""
    from google.protobuf import text_format

    pb = _schema()
    try:
        return text_format.Parse(path.read_text(encoding="utf-8"), pb.ModelConfig())
    except text_format.ParseError as e:
        raise UserInputError(f"{path} is not a valid Triton config: {e}") from None


def check_config(config: Any, io: ModelIO) -> list[str]:
    """Disagreements between a config and the model's real I/O (empty when they agree)."""
    pb = _schema()
    problems: list[str] = []
    batched = config.max_batch_size > 0
    if batched and not io.all_batched:
        problems.append(f"max_batch_size {config.max_batch_size} but not every tensor has a "
                        "dynamic batch dimension")
    for section, tensors in (("input", io.inputs), ("output", io.outputs)):
        declared = {t.name: t for t in getattr(config, section)}
        real = {t.name: t for t in tensors}
        for missing in sorted(set(real) - set(declared)):
            problems.append(f"{section} '{missing}' of the model is not in the config")
        for extra in sorted(set(declared) - set(real)):
            problems.append(f"{section} '{extra}' in the config is not in the model")
        for name in sorted(set(real) & set(declared)):
            t, d = real[name], declared[name]
            want_type = NUMPY_TO_TRITON.get(t.dtype)
            got_type = pb.DataType.Name(d.data_type)
            if want_type != got_type:
                problems.append(
                    f"{section} '{name}': config says {got_type}, model has {want_type}")
            want_dims = _dims(t, batched)
            if list(d.dims) != want_dims:
                problems.append(f"{section} '{name}': config dims {list(d.dims)}, model "
                                f"{want_dims}{' (batch dimension excluded)' if batched else ''}")
    return problems
