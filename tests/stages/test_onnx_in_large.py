"""ONNX in past protobuf's 2 GB limit: a user's ONNX whose 2.2 GB embedding table lives in an
external data file of its own name builds (import, simplify, verify, package) and the served
version folder agrees with the user's file in ONNX Runtime.

Slow: writes 2.2 GB of random weights, and the build copies them three times (about 9 GB of
disk, 3 GB of memory)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.conftest import run_cli
from trtpack.cases import load_cases

# over-2gb: the models over 2 GB build one at a time, in one xdist worker (~7 GB of disk each)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("over-2gb")]

ROWS, HIDDEN, OUT = 540_000, 1024, 16  # 2.21 GB of float32
BLOCK = 20_000  # rows written at a time


def write_big_onnx(folder: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    # one block of random rows, each copy shifted by its own small offset: every block of the
    # table differs (a read from the wrong place in the data file gives other values) at a
    # third of the CPU of drawing 2.2 GB of normal numbers
    block = rng.standard_normal((BLOCK, HIDDEN), dtype=np.float32)
    shifted = np.empty_like(block)
    with open(folder / "embeddings.bin", "wb") as f:
        for start in range(0, ROWS, BLOCK):
            rows = min(BLOCK, ROWS - start)
            np.add(block, np.float32(0.01 * start / BLOCK), out=shifted)
            f.write(shifted[:rows].data)
    table = TensorProto(name="E", data_type=TensorProto.FLOAT, dims=[ROWS, HIDDEN])
    table.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "embeddings.bin"), ("offset", "0"),
                       ("length", str(ROWS * HIDDEN * 4))):
        entry = table.external_data.add()
        entry.key, entry.value = key, value
    proj = numpy_helper.from_array(rng.standard_normal((HIDDEN, OUT), dtype=np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["E", "ids"], ["x"]),
         helper.make_node("MatMul", ["x", "W"], ["y"])], "big",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", OUT])],
        initializer=[table, proj])
    path = folder / "big.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_onnx_over_2gb_with_external_data_builds_and_serves(tmp_path: Path) -> None:
    source = write_big_onnx(tmp_path / "user")
    assert (source.parent / "embeddings.bin").stat().st_size > 2**31
    out = tmp_path / "out"
    result = run_cli("build", str(source), "--target", "cpu", "--profile", "1x4:2x8:4x16",
                     "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    imported = report["stages"][0]
    assert imported["name"] == "import" and imported["metrics"]["vocab_size"] == ROWS
    assert all(r["passed"] for r in report["verification"])
    version = out / "model_repository" / "big" / "1"
    assert (version / "model.onnx.data").stat().st_size > 2**31
    served = ort.InferenceSession(str(version / "model.onnx"))
    original = ort.InferenceSession(str(source))
    for case in load_cases(out / "artifacts" / "import" / "reference.npz"):
        ids = case.inputs["ids"]
        assert ids.max() < ROWS and len(np.unique(ids)) > 3  # in the table, not constant
        np.testing.assert_allclose(served.run(None, {"ids": ids})[0],
                                   original.run(None, {"ids": ids})[0], atol=1e-4)
