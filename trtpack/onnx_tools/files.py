"""The one weight layout of trtpack's ONNX files, and the file helpers every stage shares.

From simplify on, every stage's model is ``model.onnx`` with its weight matrices (tensors of
``LARGE_INITIALIZER_BYTES`` or more) in one ``model.onnx.data`` beside it (the "sidecar"),
named after the model. Small tensors stay inline. A protobuf holds at most 2 GiB, so a
model is serialized in memory only below ``PROTOBUF_LIMIT``. Core module: no onnx import at
module level.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    import numpy as np
    import onnx

DATA_SUFFIX = ".data"  # model.onnx -> model.onnx.data
# Initializers at least this large (64 KiB: every weight matrix, no bias) live in the sidecar.
LARGE_INITIALIZER_BYTES = 1 << 16
# Bytes of weights one serialized protobuf may hold (protobuf's hard cap is 2 GiB).
PROTOBUF_LIMIT = 1_800_000_000


def data_path(onnx_path: Path) -> Path:
    """The sidecar weight file of ``onnx_path`` (``model.onnx`` -> ``model.onnx.data``)."""
    return onnx_path.with_name(onnx_path.name + DATA_SUFFIX)


def model_bytes(onnx_path: Path) -> int:
    """Size of a model file plus its sidecar, if any."""
    data = data_path(onnx_path)
    return onnx_path.stat().st_size + (data.stat().st_size if data.is_file() else 0)


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """An initializer's size in bytes, whether its data is inline or external."""
    import numpy as np
    from onnx import helper

    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    for entry in tensor.external_data:
        if entry.key == "length":
            return int(entry.value)
    count = int(np.prod(tensor.dims)) if tensor.dims else 1
    return count * np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize


def initializer_array(tensor: onnx.TensorProto, folder: Path) -> np.ndarray:
    """An initializer's values: from its bytes, or mapped from its external data file."""
    import numpy as np
    from onnx import helper, numpy_helper
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    if not uses_external_data(tensor):
        return numpy_helper.to_array(tensor)
    info = ExternalDataInfo(tensor)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    return np.memmap(folder / info.location, dtype=dtype, mode="r", offset=info.offset or 0,
                     shape=tuple(tensor.dims))


def fits_in_protobuf(model: onnx.ModelProto) -> bool:
    """Whether an in-memory model serializes to one protobuf (weights well below 2 GiB)."""
    total = 0
    for init in model.graph.initializer:
        total += len(init.raw_data) or 4 * len(init.float_data) or 8 * len(init.int64_data)
        if total > PROTOBUF_LIMIT:
            return False
    return True


def sort_value_info(model: onnx.ModelProto) -> None:
    """The graph's ``value_info`` in name order. Its order means nothing, but tools fill it
    from sets and dicts whose order changes from process to process (string hashing is
    seeded per process): without this one model was written as different bytes by two
    builds (minilm FP16, AutoCast's output), and two machines could not serve the same
    bytes."""
    infos = sorted(model.graph.value_info, key=lambda v: v.name)
    del model.graph.value_info[:]
    model.graph.value_info.extend(infos)


def save_model(model: onnx.ModelProto, path: Path, weights_dir: Path | None = None) -> None:
    """Save an in-memory ONNX model in the layout above (an old sidecar is replaced).

    ``weights_dir``: the folder of the files a model loaded without its weights
    (``onnx.load(load_external_data=False)``) still refers to; each such tensor is copied
    from there into the new sidecar one at a time, so its weights never sit in memory
    together. The files written are the same as for the model with its weights loaded."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    data = data_path(path)
    if data.exists():
        data.unlink()
    # the tensors are written here, in onnx's order and without alignment, as onnx.save_model
    # writes tensors marked external, rather than by save_model(save_as_external_data=True):
    # that refuses a sidecar name that exists relative to the *working directory* (onnx
    # checks os.path.exists(location) unjoined)
    sidecar = None
    try:
        for tensor in _initializers(model.graph):
            blob = _external_bytes(tensor, weights_dir) if uses_external_data(tensor) \
                else tensor.raw_data if tensor.HasField("raw_data") else None
            if blob is None:
                continue
            if sys.getsizeof(blob) < LARGE_INITIALIZER_BYTES:  # small: inline
                if uses_external_data(tensor):  # as onnx.load leaves it
                    _load_inline(tensor, blob)
                continue
            if sidecar is None:
                sidecar = open(data, "wb")  # noqa: SIM115 - closed below
            offset = sidecar.tell()
            sidecar.write(blob)
            tensor.ClearField("raw_data")
            # what onnx's set_external_data writes (it wants the data in raw_data first)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            del tensor.external_data[:]
            for key, value in (("location", data.name), ("offset", offset),
                               ("length", len(blob))):
                tensor.external_data.add(key=key, value=str(value))
            del blob
        for tensor in _attribute_tensors(model.graph):  # inline, as onnx.load leaves them
            if uses_external_data(tensor):
                _load_inline(tensor, _external_bytes(tensor, weights_dir))
    finally:
        if sidecar is not None:
            sidecar.close()
    sort_value_info(model)
    onnx.save_model(model, str(path))


def _load_inline(tensor: onnx.TensorProto, blob: bytes) -> None:
    """What onnx's ``load_external_data_for_tensor`` does, with the bytes read already."""
    import onnx

    tensor.raw_data = blob
    tensor.data_location = onnx.TensorProto.DEFAULT
    del tensor.external_data[:]


def _external_bytes(tensor: onnx.TensorProto, weights_dir: Path | None) -> bytes:
    """The bytes of a tensor whose data is in a file of ``weights_dir``."""
    entries = {e.key: e.value for e in tensor.external_data}
    if weights_dir is None:
        raise ValueError(f"tensor {tensor.name!r} refers to {entries.get('location')!r}, "
                         "and no folder was given to read it from")
    location = weights_dir / entries["location"]
    if location.parent.resolve() != weights_dir.resolve():
        raise ValueError(f"tensor {tensor.name!r}: {entries['location']!r} is not a file of "
                         f"{weights_dir}")
    with open(location, "rb") as f:
        f.seek(int(entries.get("offset", 0)))
        length = entries.get("length")
        blob = f.read(int(length)) if length is not None else f.read()
    if length is not None and len(blob) != int(length):
        raise ValueError(f"tensor {tensor.name!r}: {location} ends before its data")
    return blob


def _initializers(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """The initializers of ``graph`` and of the subgraphs in its nodes' attributes."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield from _initializers(attribute.g)
            for sub in attribute.graphs:
                yield from _initializers(sub)


def _attribute_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """The tensors in the attributes of ``graph``'s nodes (``Constant`` values), in it and in
    its subgraphs (whose initializers are not among them)."""
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _attribute_tensors(attribute.g)
            for sub in attribute.graphs:
                yield from _attribute_tensors(sub)


def all_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor a graph stores: its initializers and its nodes' tensor attributes
    (``Constant`` values: some exporters keep every weight there), in it and in its
    subgraphs."""
    for tensor, _ in placed_tensors(graph):
        yield tensor


def placed_tensors(graph: onnx.GraphProto, in_body: bool = False
                   ) -> Iterator[tuple[onnx.TensorProto, bool]]:
    """``all_tensors`` with where each one is: (tensor, True) for one inside a subgraph (an
    If/Loop body) or in a list attribute, (tensor, False) for an initializer or a tensor
    attribute of the graph itself. (Told by position: protobuf's Python wrappers are made
    anew on each access, so their ``id`` says nothing.)"""
    for tensor in graph.initializer:
        yield tensor, in_body
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t, in_body
            for tensor in attribute.tensors:
                yield tensor, True
            if attribute.HasField("g"):
                yield from placed_tensors(attribute.g, True)
            for sub in attribute.graphs:
                yield from placed_tensors(sub, True)


def resave_with_sidecar(src: Path, dst: Path) -> None:
    """Rewrite a model file (weights inline or in any external files) in the layout above."""
    import onnx

    save_model(onnx.load(str(src), load_external_data=True), dst)


def move_model(src: Path, dst: Path) -> None:
    """Move a model and its sidecar (the model refers to it by file name, so the names of
    ``src`` and ``dst`` must be the same)."""
    if src.name != dst.name:
        raise ValueError(f"cannot rename {src.name} to {dst.name}: its data file is named "
                         "after it")
    os.replace(src, dst)
    if data_path(src).is_file():
        os.replace(data_path(src), data_path(dst))


def link_or_copy(src: str | Path, dst: str | Path) -> None:
    """A hard link of ``src`` at ``dst`` (its folder made), or a copy across file systems.
    (onnx >= 1.23 refuses to load an external data file with several links: stages that
    load weights with onnx copy them first, and the served repository holds copies.)"""
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def link_tree(src: Path, dst: Path) -> None:
    """``link_or_copy`` of every file under ``src`` into ``dst``."""
    shutil.copytree(src, dst, copy_function=link_or_copy, dirs_exist_ok=True)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


class GraphSummary(TypedDict):
    nodes: int
    opset: int | None
    op_types: dict[str, int]


def graph_summary(path: Path) -> GraphSummary:
    """Node count, opset and op-type counts of a model file (weights not loaded)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    ops: dict[str, int] = {}
    for node in model.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return {
        "nodes": len(model.graph.node),
        "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                      None),
        "op_types": dict(sorted(ops.items(), key=lambda kv: -kv[1])),
    }
