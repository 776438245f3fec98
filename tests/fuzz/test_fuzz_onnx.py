"""Fuzzed ONNX files, read as ``trtpack build FILE.onnx`` reads them (``resolve_model``: the
graph sniffed for inputs, outputs, axes and opset): real exported models (a tiny BERT written
by torch.onnx's TorchScript exporter in one file, and by the dynamo exporter with its weights
in ``model.onnx.data``) truncated, bit-flipped, overwritten, and edited field by field (names,
element types, dims, opsets, external-data entries). Each gives a recipe or a
``UserInputError`` naming the file, never another exception."""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.mutations import Counter, damaged_bytes, fuzz_settings, min_examples
from trtpack.errors import UserInputError
from trtpack.sources.recipe import Recipe
from trtpack.sources.resolve import resolve_model

MIN_EXAMPLES = 500


def _export_tiny_bert(folder: Path, dynamo: bool) -> Path:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=200, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=32, pad_token_id=0)

    class Tokens(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = transformers.BertModel(config)

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state

    model = Tokens().eval()
    ids = torch.ones(2, 8, dtype=torch.int64)
    folder.mkdir(parents=True)
    path = folder / "model.onnx"
    names = {"input_names": ["input_ids", "attention_mask"],
             "output_names": ["last_hidden_state"]}
    if dynamo:
        batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("sequence", max=32)
        program = torch.onnx.export(model, (ids, ids), dynamo=True, **names,
                                    dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
        assert program is not None
        program.save(str(path), external_data=True)
    else:
        axes = {"input_ids": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "sequence"}}
        torch.onnx.export(model, (ids, ids), str(path), dynamo=False, opset_version=17,
                          dynamic_axes=axes, **names)
    return path


@pytest.fixture(scope="module")
def real_models() -> Iterator[dict[str, Path]]:
    root = Path(tempfile.mkdtemp(prefix="trtpack-fuzz-onnx-src-"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporters' tracer warnings
        models = {"torchscript": _export_tiny_bert(root / "torchscript", dynamo=False),
                  "dynamo": _export_tiny_bert(root / "dynamo", dynamo=True)}
    yield models
    shutil.rmtree(root)


def _edit_model(model: Any, data: st.DataObject) -> None:
    """Change one field of a ModelProto the way another tool or a hand edit might."""
    from onnx import TensorProto

    graph = model.graph
    values = [*graph.input, *graph.output]
    op = data.draw(st.sampled_from(["name", "dtype", "dim", "opset", "drop_output",
                                    "duplicate_input", "external", "drop_node", "no_shape"]))
    if op == "name":
        data.draw(st.sampled_from(values)).name = data.draw(
            st.sampled_from(["", "input_ids", "last_hidden_state", "x y", "ü", "a" * 300]))
    elif op == "dtype":
        data.draw(st.sampled_from(values)).type.tensor_type.elem_type = data.draw(
            st.integers(0, 25))
    elif op == "dim":
        dims = data.draw(st.sampled_from(values)).type.tensor_type.shape.dim
        if dims:
            dim = dims[data.draw(st.integers(0, len(dims) - 1))]
            choice = data.draw(st.sampled_from(["value", "param", "clear"]))
            if choice == "value":
                dim.dim_value = data.draw(st.integers(-5, 2**40))
            elif choice == "param":
                dim.dim_param = data.draw(st.sampled_from(["", "batch", "sequence", "n m"]))
            else:
                dim.Clear()
    elif op == "opset":
        model.opset_import[0].version = data.draw(st.integers(-1, 40))
    elif op == "drop_output" and graph.output:
        del graph.output[data.draw(st.integers(0, len(graph.output) - 1))]
    elif op == "duplicate_input" and graph.input:
        graph.input.add().CopyFrom(graph.input[0])
    elif op == "external":
        tensors = [t for t in graph.initializer if t.data_location == TensorProto.EXTERNAL]
        if tensors:
            entries = data.draw(st.sampled_from(tensors)).external_data
            entry = entries[data.draw(st.integers(0, len(entries) - 1))]
            entry.value = data.draw(st.sampled_from(
                ["", "abc", "-1", "99999999999", "../../etc/passwd", "/abs/path", "missing",
                 "1e3", "0x10"]))
    elif op == "drop_node" and graph.node:
        del graph.node[data.draw(st.integers(0, len(graph.node) - 1))]
    elif op == "no_shape":
        data.draw(st.sampled_from(values)).type.tensor_type.ClearField("shape")


def test_onnx_files_fuzzed(real_models: dict[str, Path]) -> None:
    import onnx

    seen = Counter("ONNX sniffing")
    work = Path(tempfile.mkdtemp(prefix="trtpack-fuzz-onnx-"))
    originals = {kind: (path.read_bytes(), (path.parent / "model.onnx.data").read_bytes()
                        if (path.parent / "model.onnx.data").is_file() else None)
                 for kind, path in real_models.items()}

    @fuzz_settings(MIN_EXAMPLES + 100)
    @given(kind=st.sampled_from(sorted(originals)), how=st.sampled_from(
        ["bytes", "bytes", "fields", "fields", "data"]), data=st.data())
    def check(kind: str, how: str, data: st.DataObject) -> None:
        seen()
        model_bytes, weights = originals[kind]
        folder = work / "case"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        path = folder / "user-model.onnx"
        if how == "fields":
            model = onnx.load_from_string(model_bytes)
            for _ in range(data.draw(st.integers(1, 3))):
                _edit_model(model, data)
            model_bytes = model.SerializeToString()
        elif how == "bytes" or weights is None:
            model_bytes = data.draw(damaged_bytes(model_bytes, focus=4096))
        if weights is not None:
            if how == "data":
                weights = data.draw(damaged_bytes(weights))
            (folder / "model.onnx.data").write_bytes(weights)
        path.write_bytes(model_bytes)
        try:
            recipe = resolve_model(str(path))
        except UserInputError as e:
            assert str(path) in str(e) or path.name in str(e), str(e)
            assert "\n" not in str(e), str(e)
            return
        assert isinstance(recipe, Recipe) and recipe.inputs and recipe.outputs
        assert recipe.source.onnx == str(path.resolve())

    check()
    assert seen.count >= min_examples(MIN_EXAMPLES)
