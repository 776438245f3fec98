"""Tensor and model I/O (names, dtypes, dims), read from ONNX or from what TensorRT reports.

``ModelIO`` is the plain description of a model's tensors that every layer uses: the engine
stage records it in ``model.plan.json``, serving turns it into ``config.pbtxt``, inspection
compares against it. The dtype tables (numpy ↔ Triton, ONNX, TensorRT) live here once.
onnx is imported inside ``model_io_from_onnx``; nothing here imports TensorRT.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from trtpack.errors import UserInputError
from trtpack.shapes import BATCH_AXIS

if TYPE_CHECKING:
    import onnx

NUMPY_TO_TRITON = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32", "uint64": "TYPE_UINT64", "int8": "TYPE_INT8",
    "int16": "TYPE_INT16", "int32": "TYPE_INT32", "int64": "TYPE_INT64",
    "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
    "bytes": "TYPE_STRING", "object": "TYPE_STRING", "bfloat16": "TYPE_BF16",
}
TRITON_TO_NUMPY = {v: k for k, v in NUMPY_TO_TRITON.items() if k != "object"}

ONNX_ELEM_TO_NUMPY = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    8: "bytes", 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64",
    16: "bfloat16",
}

# tensorrt.DataType member name -> numpy dtype name (None: no numpy/Triton equivalent)
TRT_DTYPE_TO_NUMPY: dict[str, str | None] = {
    "FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT8": "int8",
    "INT32": "int32", "INT64": "int64", "BOOL": "bool", "UINT8": "uint8",
    "FP8": None, "INT4": None, "FP4": None, "E8M0": None,
}


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


def model_io_from_onnx(path: Path, batch_axis: str = BATCH_AXIS) -> ModelIO:
    """The real I/O of an ONNX file (weights are not loaded)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}

    def tensor(value: onnx.ValueInfoProto) -> TensorIO:
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


@dataclass(frozen=True)
class EngineTensor:
    """One I/O tensor as the TensorRT API reports it."""

    name: str
    mode: Literal["input", "output"]
    dtype: str  # tensorrt.DataType member name, e.g. "FLOAT", "INT64"
    shape: tuple[int, ...]  # -1 for dynamic dimensions


def numpy_dtype(trt_dtype: str, tensor: str = "") -> str:
    """The numpy dtype name of a ``tensorrt.DataType`` member name."""
    dtype = TRT_DTYPE_TO_NUMPY.get(trt_dtype)
    if dtype is None:
        raise UserInputError(f"engine tensor '{tensor}' has TensorRT type {trt_dtype}, which "
                             "Triton cannot take as model I/O")
    return dtype


def engine_model_io(tensors: Sequence[EngineTensor],
                    batch_names: Collection[str] | None = None) -> ModelIO:
    """An engine's I/O as a ``ModelIO`` (numpy dtype names, -1 for dynamic dimensions).

    ``batch_names`` are the tensors whose first dimension is the batch axis (from the ONNX
    model's symbolic axes); without it, a dynamic first dimension counts as the batch.
    """

    def io(t: EngineTensor) -> TensorIO:
        dynamic_first = bool(t.shape) and t.shape[0] == -1
        batch = dynamic_first and (batch_names is None or t.name in batch_names)
        return TensorIO(t.name, numpy_dtype(t.dtype, t.name), tuple(t.shape), batch)

    return ModelIO(tuple(io(t) for t in tensors if t.mode == "input"),
                   tuple(io(t) for t in tensors if t.mode == "output"))
