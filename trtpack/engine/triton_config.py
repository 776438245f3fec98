"""The Triton config of a TensorRT engine, from the engine's real I/O and its profiles.

``engine_model_io`` turns what the TensorRT API says about an engine's tensors (names,
I/O mode, data type names, shapes with -1 for dynamic dimensions) into a ``ModelIO``;
``engine_model_config`` turns that plus the profiles into a ``ModelConfig`` for the
``tensorrt_plan`` platform: ``serving.config.model_config`` plus what is specific to
engines (one instance group naming every profile, warm-up requests, CUDA graphs).
Both are pure; ``tensorrt_api.engine_tensors`` does the reading from a real engine.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trtpack.errors import UserInputError
from trtpack.recipe import TritonSettings
from trtpack.serving.config import (
    NUMPY_TO_TRITON,
    ModelIO,
    TensorIO,
    max_batch_size,
    model_config,
)
from trtpack.shapes import ShapeProfile

PLATFORM = "tensorrt_plan"
MODEL_FILENAME = "model.plan"

# tensorrt.DataType member name -> numpy dtype name (None: no numpy/Triton equivalent)
TRT_DTYPE_TO_NUMPY: dict[str, str | None] = {
    "FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT8": "int8",
    "INT32": "int32", "INT64": "int64", "BOOL": "bool", "UINT8": "uint8",
    "FP8": None, "INT4": None, "FP4": None, "E8M0": None,
}


@dataclass(frozen=True)
class EngineTensor:
    """One I/O tensor as the TensorRT API reports it."""

    name: str
    mode: Literal["input", "output"]
    dtype: str  # tensorrt.DataType member name, e.g. "FLOAT", "INT64"
    shape: tuple[int, ...]  # -1 for dynamic dimensions


def numpy_dtype(trt_dtype: str, tensor: str = "") -> str:
    dtype = TRT_DTYPE_TO_NUMPY.get(trt_dtype)
    if dtype is None:
        raise UserInputError(f"engine tensor '{tensor}' has TensorRT type {trt_dtype}, which "
                             "Triton cannot take as model I/O")
    return dtype


def engine_model_io(tensors: Sequence[EngineTensor],
                    batch_names: Collection[str] | None = None) -> ModelIO:
    """The engine's I/O as a ``ModelIO`` (numpy dtype names, -1 for dynamic dimensions).

    ``batch_names`` are the tensors whose first dimension is the batch axis (from the ONNX
    model's symbolic axes); without it, a dynamic first dimension counts as the batch.
    """

    def io(t: EngineTensor) -> TensorIO:
        dynamic_first = bool(t.shape) and t.shape[0] == -1
        batch = dynamic_first and (batch_names is None or t.name in batch_names)
        return TensorIO(t.name, numpy_dtype(t.dtype, t.name), tuple(t.shape), batch)

    return ModelIO(tuple(io(t) for t in tensors if t.mode == "input"),
                   tuple(io(t) for t in tensors if t.mode == "output"))


def _opt_batch(profile: ShapeProfile, limit: int) -> int:
    return max(1, min(profile.axis_range(0)[1], limit))


def _profile_shape(profile: ShapeProfile, name: str, corner: str) -> tuple[int, ...]:
    if name not in profile.shapes:
        raise UserInputError(f"engine input '{name}' has no shape in profile {profile}")
    return tuple(profile.shapes[name].corner(corner))


def engine_model_config(name: str, engine_io: ModelIO, profiles: Sequence[ShapeProfile],
                        settings: TritonSettings) -> Any:
    """A ``ModelConfig`` (Triton's protobuf message) serving ``1/model.plan``.

    - platform ``tensorrt_plan``, dims and data types as the engine has them;
    - ``max_batch_size`` is the smallest max batch over the profiles (0 when some tensor
      has no dynamic batch), so every batch Triton forms fits every profile;
    - one GPU instance group listing every profile index: Triton picks the profile that
      fits each request's shapes;
    - dynamic batching with the profiles' opt batches as preferred sizes;
    - ``settings.warmup``: one zero-filled warm-up request per profile at its opt shape;
    - ``settings.cuda_graphs``: CUDA graphs captured at each profile's opt shape.
    """
    if not profiles:
        raise UserInputError("an engine config needs at least one profile")
    config = model_config(
        name, engine_io, profiles, settings, platform=PLATFORM, kind="KIND_GPU",
        profile_names=[str(i) for i in range(len(profiles))],
        default_model_filename=MODEL_FILENAME,
    )
    mbs = int(config.max_batch_size)
    batched = mbs > 0
    if settings.warmup:
        _add_warmup(config, engine_io, profiles, mbs)
    if settings.cuda_graphs:
        cuda = config.optimization.cuda
        cuda.graphs = True
        for profile in profiles:
            spec = cuda.graph_spec.add(batch_size=_opt_batch(profile, mbs) if batched else 0)
            for t in engine_io.inputs:
                shape = _profile_shape(profile, t.name, "opt")
                spec.input[t.name].dim.extend(shape[1:] if batched else shape)
    return config


def _add_warmup(config: Any, io: ModelIO, profiles: Sequence[ShapeProfile], mbs: int) -> None:
    from tritonclient.grpc import model_config_pb2 as pb

    batched = mbs > 0
    for index, profile in enumerate(profiles):
        warmup = config.model_warmup.add(
            name=f"profile{index}_opt", batch_size=_opt_batch(profile, mbs) if batched else 1,
            count=1,
        )
        for t in io.inputs:
            shape = _profile_shape(profile, t.name, "opt")
            warmup.inputs[t.name].CopyFrom(pb.ModelWarmup.Input(
                data_type=pb.DataType.Value(NUMPY_TO_TRITON[t.dtype]),
                dims=list(shape[1:] if batched else shape),
                zero_data=True,  # valid token ids / masks; random ids may be out of vocabulary
            ))


def engine_max_batch_size(engine_io: ModelIO, profiles: Sequence[ShapeProfile]) -> int:
    """The ``max_batch_size`` the engine's config gets (exposed for reports)."""
    return max_batch_size(engine_io, profiles)


def write_engine_model(repo: Path, name: str, plan: Path, profiles: Sequence[ShapeProfile],
                       settings: TritonSettings, version: int = 1) -> Path:
    """A ``tensorrt_plan`` model directory ``repo/name/`` with ``<version>/model.plan``, its
    ``model.plan.json`` beside it, and a ``config.pbtxt`` derived from the engine's I/O as
    recorded in the provenance (no TensorRT needed); the config is checked against it."""
    from trtpack.engine.provenance import EngineProvenance, provenance_path
    from trtpack.serving.config import check_config, write_config

    prov_file = provenance_path(plan)
    if not prov_file.is_file():
        raise UserInputError(f"{plan} has no {prov_file.name}: the engine's I/O is unknown")
    io = EngineProvenance.load(prov_file).model_io()
    config = engine_model_config(name, io, profiles, settings)
    problems = check_config(config, io)
    if problems:
        raise UserInputError(f"the config for engine {plan} does not match it: "
                             + "; ".join(problems))
    model_dir = repo / name
    version_dir = model_dir / str(version)
    version_dir.mkdir(parents=True, exist_ok=True)
    for src, dst in ((plan, version_dir / MODEL_FILENAME),
                     (prov_file, version_dir / provenance_path(Path(MODEL_FILENAME)).name)):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
    write_config(model_dir / "config.pbtxt", config)
    return model_dir
