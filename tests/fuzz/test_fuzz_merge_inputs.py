"""Fuzzed inputs of ``trtpack merge``: a build folder's ``report.json``, its engine's
provenance (``model.plan.json``) and its ``config.pbtxt``, made from valid ones (fields
replaced by values of other JSON types, deleted or added; text truncated and bit-flipped),
read in-process by ``read_engine_build`` and checked against a good build with
``check_compatible``. Each is a build or a ``UserInputError`` naming the folder and the
file, never another exception. The plan is stand-in bytes (no TensorRT here): merge reads
files and configs, it does not run engines."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.mutations import (
    ANY_VALUE,
    Counter,
    damaged_bytes,
    fuzz_settings,
    min_examples,
    mutated_document,
)
from trtpack.engine.builder import builder_settings
from trtpack.engine.provenance import EngineProvenance, io_records, provenance_path
from trtpack.errors import UserInputError
from trtpack.model_io import model_io_from_onnx
from trtpack.serving.engine_builds import check_compatible, read_engine_build
from trtpack.serving.layout import write_engine_model
from trtpack.shapes import TensorSpec, parse_profiles
from trtpack.sources.recipe import EngineSettings, TritonSettings

MIN_EXAMPLES = 500
NAME = "embedder"


def _tiny_onnx(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.ones((50, 8), np.float32), "E")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["E", "input_ids"], ["last_hidden_state"])], "g",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                       ["batch", "sequence", 8])], initializer=[table])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def make_engine_build(root: Path, sm: str) -> Path:
    """A build folder as the engine stage leaves it for a GPU of compute capability ``sm``."""
    folder = root / f"build-{sm}"
    work = folder / "artifacts" / "engine"
    work.mkdir(parents=True)
    _tiny_onnx(work / "model.onnx")
    plan = work / "model.plan"
    plan.write_bytes(b"stand-in engine bytes, not an engine")
    specs = [TensorSpec("input_ids", "int64", ("batch", "sequence"), "token_ids")]
    profiles = parse_profiles(["1x4:2x8:4x16"], specs)
    inputs, outputs = io_records(model_io_from_onnx(work / "model.onnx"))
    EngineProvenance(
        trtpack_version="0.1.0", tensorrt_version="10.13.0.35", gpu_name=f"GPU sm {sm}",
        compute_capability=sm, target="g5", precision="fp16",
        profiles=[p.to_dict() for p in profiles],
        build_options=builder_settings(EngineSettings(), (10, 13, 0, 35)).to_dict(),
        onnx_sha256="a" * 64, onnx_data_sha256=None, plan_sha256="b" * 64,
        plan_bytes=plan.stat().st_size, inputs=inputs, outputs=outputs,
    ).save(provenance_path(plan))
    write_engine_model(folder / "model_repository", NAME, plan, profiles, TritonSettings())
    (folder / "report.json").write_text(json.dumps(
        {"model": NAME, "target": "g5", "precision": "fp16", "status": "ok"}))
    return folder


@pytest.fixture(scope="module")
def builds() -> Iterator[tuple[Path, Path]]:
    root = Path(tempfile.mkdtemp(prefix="trtpack-fuzz-merge-"))
    yield make_engine_build(root, "8.6"), make_engine_build(root, "8.9")
    shutil.rmtree(root)


def _json_text(document: Any) -> bytes:
    return json.dumps(document, indent=2, allow_nan=True).encode()


def test_merge_inputs_fuzzed(builds: tuple[Path, Path]) -> None:
    good_folder, folder = builds
    good = read_engine_build(good_folder)
    version = folder / "model_repository" / NAME / "1"
    files = {"provenance": version / "model.plan.json", "report": folder / "report.json",
             "config": folder / "model_repository" / NAME / "config.pbtxt"}
    originals = {k: p.read_bytes() for k, p in files.items()}
    check_compatible([good, read_engine_build(folder)])  # the unmodified pair merges
    seen = Counter("merge inputs")

    @fuzz_settings(MIN_EXAMPLES + 100)
    @given(which=st.sampled_from(["provenance", "provenance", "provenance", "report",
                                  "config"]),
           how=st.sampled_from(["fields", "fields", "bytes"]), data=st.data())
    def check(which: str, how: str, data: st.DataObject) -> None:
        seen()
        for key, path in files.items():
            path.unlink()
            path.write_bytes(originals[key])  # a fresh file: never through a shared link
        content = originals[which]
        if how == "fields" and which != "config":
            document = json.loads(content)
            values = st.one_of(ANY_VALUE, st.sampled_from(
                ["8.6", "9.0", "x.y", "8.", ".6", "", "١.٢", math.nan, -1, 2**70]))
            content = _json_text(data.draw(mutated_document(document, values)))
        else:
            content = data.draw(damaged_bytes(content))
        files[which].unlink()
        files[which].write_bytes(content)
        try:
            build = read_engine_build(folder)
            check_compatible([good, build])
        except UserInputError as e:
            message = str(e)
            # the folder named first ("build folder '<folder>' ...": engine_builds.build_error)
            assert message.startswith(f"build folder '{folder}'") \
                or str(files["config"]) in message, message
        else:
            assert build.name and build.provenance.cc >= (0, 0)

    check()
    assert seen.count >= min_examples(MIN_EXAMPLES)
