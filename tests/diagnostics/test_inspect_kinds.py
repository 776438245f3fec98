"""``trtpack inspect PATH`` through the command line: it says what PATH is (a build folder, a
model repository, one model of it, an ONNX file, an engine) and shows the precision served,
the inputs and outputs with dtypes and dims, the profiles, where it came from and whether it
runs here; anything else is exit 2 with one error line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from tests.conftest import run_cli, trtpack
from trtpack.diagnostics.model_files import load_onnx_graph, onnx_precision
from trtpack.testing.models import conv_onnx

WIDE = {"COLUMNS": "400"}


def flat(text: str) -> str:
    return " ".join(text.split())


def test_a_build_folder(tiny_build: Path) -> None:
    result = run_cli("inspect", str(tiny_build))
    assert result.exit_code == 0, result.output
    text = flat(result.stdout)
    assert f"{tiny_build}: a trtpack build folder" in text
    assert "built by trtpack" in text and "tiny-bert, precision fp32, target cpu" in text
    assert "profiles 1x4:2x8:4x16 2x16:4x32:8x64, status ok" in text
    assert "tiny-bert (onnxruntime_onnx, serves fp32, max_batch_size 8, KIND_CPU)" in text
    assert "input input_ids int64 [batch, sequence]" in text
    assert "output last_hidden_state float32 [batch, sequence, 64]" in text
    assert "runs on this machine: not checked" in text


def test_a_model_repository_and_one_model_of_it(tiny_build: Path) -> None:
    repo = tiny_build / "model_repository"
    text = flat(run_cli("inspect", str(repo)).stdout)
    assert f"{repo}: a Triton model repository" in text and "serves fp32" in text
    model = run_cli("inspect", str(repo / "tiny-bert"), "--check")
    assert model.exit_code == 0, model.output
    text = flat(model.stdout)
    assert f"{repo / 'tiny-bert'}: one model of a Triton model repository" in text
    assert "runs on this machine (ONNX Runtime loads" in text and ": yes" in text


def test_an_onnx_file_of_a_build(tiny_build: Path) -> None:
    served = tiny_build / "model_repository" / "tiny-bert" / "1" / "model.onnx"
    result = run_cli("inspect", str(served))
    assert result.exit_code == 0, result.output
    text = flat(result.stdout)
    assert f"{served}:anONNXmodel" in "".join(text.split())  # a long tmp_path may wrap
    assert "engine" not in text  # it was once shown as an engine with unknown provenance
    assert "precision fp32; opset" in text
    assert "input input_ids int64 [batch, sequence]" in text
    assert "output last_hidden_state float32 [batch, sequence, 64]" in text
    assert "built by trtpack" in text and "tiny-bert, precision fp32" in text
    assert "runs on this machine (ONNX Runtime loads it): yes" in text


def test_an_onnx_file_from_elsewhere(tmp_path: Path) -> None:
    model = conv_onnx(tmp_path / "conv.onnx")
    result = trtpack("inspect", str(model), env=WIDE)  # a long tmp_path (xdist) is not wrapped
    assert result.returncode == 0, result.stderr
    text = flat(result.stdout)
    assert f"{model}: an ONNX model" in text and "precision fp32; opset 17, 5 nodes" in text
    assert "input image float32 [batch, 3, height, width]" in text
    assert "output features float32 [batch, 32]" in text
    assert "built by" not in text
    assert "runs on this machine (ONNX Runtime loads it): yes" in text


def test_an_onnx_file_onnx_runtime_cannot_load(tmp_path: Path) -> None:
    path = conv_onnx(tmp_path / "conv.onnx")
    model = onnx.load(str(path))
    model.graph.node[1].op_type = "NoSuchOperator"
    onnx.save(model, str(path))
    text = flat(trtpack("inspect", str(path)).stdout)
    assert "runs on this machine (ONNX Runtime loads it): no" in text
    assert "ONNX Runtime cannot load it" in text


def test_precision_is_read_from_the_graph(tmp_path: Path) -> None:
    path = conv_onnx(tmp_path / "conv.onnx")
    assert onnx_precision(load_onnx_graph(path)) == "fp32"
    model = onnx.load(str(path))
    weight = model.graph.initializer[0]
    weight.CopyFrom(numpy_helper.from_array(
        numpy_helper.to_array(weight).astype(np.float16), weight.name))
    assert onnx_precision(model).startswith("fp16 (1 of 2 weight tensors")
    model.graph.node.insert(0, onnx.helper.make_node(
        "DequantizeLinear", ["q", "scale"], ["image_dq"]))
    assert onnx_precision(model).startswith("int8 (1 quantization")


def test_a_text_file_named_onnx_is_exit_2(tmp_path: Path) -> None:
    fake = tmp_path / "fake.onnx"
    fake.write_text("hello, I am not a model\n")
    result = trtpack("inspect", str(fake))
    assert result.returncode == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"error: '{fake}' is not an ONNX model"), lines
    assert "engine" not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_other_files_and_folders_are_exit_2(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    result = trtpack("inspect", str(notes))
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: '{notes}' is a file trtpack does not inspect")
    assert "hint: give an ONNX file (.onnx), an engine (model.plan)" in flat(result.stderr)
    (tmp_path / "empty").mkdir()
    result = trtpack("inspect", str(tmp_path / "empty"))
    assert result.returncode == 2 and "is not an engine (model.plan), an ONNX file" in \
        flat(result.stderr)
    assert trtpack("inspect", str(tmp_path / "missing")).returncode == 2
