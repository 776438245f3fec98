"""Triton ``config.pbtxt`` from a model's real I/O, through Triton's protobuf schema.

``model_config`` turns a ``ModelIO`` (``trtpack.model_io``) plus the shape profiles and the
recipe's serving options into a ``ModelConfig`` message, for every platform;
``onnx_model_config`` and ``engine_model_config`` add what is specific to ONNX Runtime and
TensorRT models, and ``add_warmup`` is the one warm-up writer both use.
``write_config``/``read_config`` print and parse a config with ``google.protobuf.text_format``;
``check_config`` proves a config and a model agree. tritonclient (the schema) is imported
inside the functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Literal

from trtpack.engine.provenance import PLAN_FILENAME
from trtpack.errors import UserInputError
from trtpack.model_io import NUMPY_TO_TRITON, ModelIO, TensorIO
from trtpack.serving.triton_rules import (
    engine_max_batch_size,
    preferred_batch_sizes,
    shared_graph_shapes,
)
from trtpack.shapes import ShapeProfile
from trtpack.sources.recipe import TritonSettings

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


InstanceKind = Literal["KIND_CPU", "KIND_GPU", "KIND_MODEL"]

ONNX_PLATFORM = "onnxruntime_onnx"
ENGINE_PLATFORM = "tensorrt_plan"
ONNX_FILENAME = "model.onnx"
CONFIG_FILE = "config.pbtxt"
"""Every Triton model directory's config file."""


def _schema() -> ModuleType:
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2


def max_batch_size(io: ModelIO, profiles: Sequence[ShapeProfile]) -> int:
    """The largest profile max batch when every tensor has a dynamic batch dimension, else 0
    (``triton_rules.engine_max_batch_size``: with the smallest, Triton's TensorRT backend
    fails to load a profile whose min batch is above it and never uses the larger ones)."""
    if not io.all_batched or not profiles:
        return 0
    return engine_max_batch_size(profiles)


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
) -> ModelConfig:
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


def _opt_batch(profile: ShapeProfile, limit: int) -> int:
    return max(1, min(profile.axis_range(0)[1], limit))


def _opt_dims(profile: ShapeProfile, t: TensorIO, batched: bool) -> list[int]:
    """An input's dims at the profile's opt corner (batch excluded when ``batched``); an
    input the profile does not name keeps its own shape if that has no dynamic dimension."""
    if t.name in profile.shapes:
        shape = tuple(profile.shapes[t.name].corner("opt"))
    elif -1 not in _dims(t, batched):
        shape = t.shape
    else:
        raise UserInputError(f"model input '{t.name}' has no shape in profile {profile}")
    return list(shape[1:] if batched else shape)


def add_warmup(config: ModelConfig, io: ModelIO, profiles: Sequence[ShapeProfile]) -> None:
    """One warm-up request per profile, named ``profile_<k>_opt``, at the profile's opt shape
    (batch clamped to ``max_batch_size``): random data for floating-point inputs, zeros for
    integer ones (token ids and masks: Triton's random data is random bytes, which would be
    ids outside the vocabulary)."""
    mbs = int(config.max_batch_size)
    batched = mbs > 0
    for k, profile in enumerate(profiles):
        sample = config.model_warmup.add(
            name=f"profile_{k}_opt", batch_size=_opt_batch(profile, mbs) if batched else 1,
            count=1)
        for t in io.inputs:
            entry = sample.inputs[t.name]
            entry.data_type = _triton_type(t)
            entry.dims.extend(_opt_dims(profile, t, batched))
            if t.dtype.startswith("int"):
                entry.zero_data = True
            else:
                entry.random_data = True


def onnx_model_config(name: str, io: ModelIO, profiles: Sequence[ShapeProfile],
                      settings: TritonSettings, kind: InstanceKind) -> ModelConfig:
    """A ``ModelConfig`` serving ``1/model.onnx`` with ONNX Runtime on ``kind`` instances."""
    config = model_config(name, io, profiles, settings, platform=ONNX_PLATFORM,
                          kind=kind, default_model_filename=ONNX_FILENAME)
    if settings.warmup:
        add_warmup(config, io, profiles)
    return config


def engine_model_config(name: str, engine_io: ModelIO, profiles: Sequence[ShapeProfile],
                        settings: TritonSettings) -> ModelConfig:
    """A ``ModelConfig`` serving ``1/model.plan`` (a TensorRT engine).

    - platform ``tensorrt_plan``, dims and data types as the engine has them;
    - ``max_batch_size`` is the largest max batch over the profiles (0 when some tensor
      has no dynamic batch), so every profile loads in Triton and is used
      (``triton_rules``; profile sets with a gap in their batch ranges are refused before
      the build);
    - one GPU instance group listing every profile index: Triton picks the profile that
      fits each batch's shapes;
    - dynamic batching with the profiles' opt batches above 1 and the max batch as
      preferred sizes;
    - ``settings.warmup``: one warm-up request per profile at its opt shape (``add_warmup``);
    - ``settings.cuda_graphs``: CUDA graphs at the shapes every profile holds (each
      profile's opt clamped into them, ``triton_rules.shared_graph_shapes``): Triton
      captures every spec on every profile's context; none when the profiles share none.
    """
    if not profiles:
        raise UserInputError("an engine config needs at least one profile")
    config = model_config(
        name, engine_io, profiles, settings, platform=ENGINE_PLATFORM, kind="KIND_GPU",
        profile_names=[str(i) for i in range(len(profiles))],
        default_model_filename=PLAN_FILENAME,
    )
    mbs = int(config.max_batch_size)
    batched = mbs > 0
    if settings.warmup:
        add_warmup(config, engine_io, profiles)
    graph_shapes = shared_graph_shapes(profiles) if settings.cuda_graphs else []
    if graph_shapes:
        cuda = config.optimization.cuda
        cuda.graphs = True
        for shape in graph_shapes:
            first = next(iter(shape.values()))
            spec = cuda.graph_spec.add(batch_size=min(first[0], mbs) if batched else 0)
            for t in engine_io.inputs:
                named = shape.get(t.name)
                spec.input[t.name].dim.extend(
                    _opt_dims(profiles[0], t, batched) if named is None
                    else named[1:] if batched else named)
    return config


CUDA_GRAPHS_NOT_WRITTEN = (
    "cuda_graphs: no graph written, since the profiles hold no shape in common and Triton's "
    "TensorRT backend captures every graph spec on every profile's context (a spec outside "
    "a profile fails there); use one profile, or profiles that share a shape")


def python_model_config(name: str, io: ModelIO, profiles: Sequence[ShapeProfile],
                        settings: TritonSettings, params: Mapping[str, str]) -> ModelConfig:
    """A Python-backend helper model (tokenizer, post-processing) on CPU instances: the
    instance count and version policy of ``settings``; no cache, graphs, warm-up or
    batching queue (Python models get one request per input tensor; queueing only adds
    latency). ``params`` become the config's string parameters."""
    helper = settings.model_copy(update={"response_cache": False, "cuda_graphs": False,
                                         "warmup": False})
    config = model_config(name, io, profiles, helper, backend="python", kind="KIND_CPU")
    config.ClearField("dynamic_batching")
    for key, value in params.items():
        config.parameters[key].string_value = value
    return config


def _triton_type(t: TensorIO) -> int:
    pb = _schema()
    if t.dtype not in NUMPY_TO_TRITON:
        raise UserInputError(f"tensor '{t.name}' has dtype {t.dtype}, which Triton cannot serve")
    return int(pb.DataType.Value(NUMPY_TO_TRITON[t.dtype]))


def config_text(config: ModelConfig) -> str:
    from google.protobuf import text_format

    return str(text_format.MessageToString(config))


def write_config(path: Path, config: ModelConfig, notes: Sequence[str] = ()) -> None:
    """``config.pbtxt``; ``notes`` go above it as ``#`` comments (protobuf text format's
    comments, which Triton's parser skips)."""
    import textwrap

    header = "".join(f"# {line}\n" for note in notes for line in textwrap.wrap(note, 96))
    path.write_text(header + config_text(config), encoding="utf-8")


def read_config(path: Path) -> ModelConfig:
    """Parse a ``config.pbtxt`` with Triton's schema (raises ``UserInputError`` if invalid)."""
    from google.protobuf import text_format

    pb = _schema()
    try:
        return text_format.Parse(path.read_text(encoding="utf-8"), pb.ModelConfig())
    except text_format.ParseError as e:
        raise UserInputError(f"{path} is not a valid Triton config: {e}") from None
    except UnicodeDecodeError as e:
        raise UserInputError(f"{path} is not a valid Triton config: not UTF-8 text (byte "
                             f"{e.start})") from None


def check_config(config: ModelConfig, io: ModelIO) -> list[str]:
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
