"""A model past protobuf's 2 GB limit (recipe big-embedding: 2.46 GB of float32 weights) builds
into a Triton repository whose ``1/model.onnx`` keeps its weights in an external data file next
to it, referenced by a relative name: the version folder still runs after it is moved away
from the build output and everything else of the build is deleted.

Slow: the factory fills 2.46 GB of weights and the build writes them once more (about a minute,
2.5 GB of disk, 3 GB of memory).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# over-2gb: the models over 2 GB build one at a time, in one xdist worker (~7 GB of disk each)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("over-2gb")]

MODEL = "big-embedding"
OUTPUT = "sentence_embedding"
PROTOBUF_LIMIT = 2**31
BUILD_TIMEOUT_SECONDS = 1800


@pytest.fixture(scope="module")
def big_model() -> Any:
    from trtpack.testing.models import big_embedding_model

    return big_embedding_model()


def _build(out: Path, precision: str, cache: Path) -> Path:
    """``trtpack build big-embedding`` as a user runs it, in its own process (FP16: checked
    for a later GPU build, as --target cpu serves FP32)."""
    target = ["--target", "g5", "--no-engine"] if precision == "fp16" else ["--target", "cpu"]
    proc = subprocess.run(
        [sys.executable, "-m", "trtpack.cli", "build", MODEL, *target,
         "--precision", precision, "--out", str(out), "--cache-dir", str(cache)],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_SECONDS, check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return out


@pytest.fixture(scope="module")
def big_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This module's stage cache: the FP16 build reuses the FP32 build's export, simplify
    and verify (hard links: no disk; the 2.46 GB model is exported once, not twice), and
    runs its precision stage on them. Not the session cache: GBs, removed with the module."""
    folder = tmp_path_factory.mktemp("big-cache")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def build_out(tmp_path_factory: pytest.TempPathFactory, big_cache: Path) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("big-build")
    yield _build(folder / "out", "fp32", big_cache)
    shutil.rmtree(folder, ignore_errors=True)  # GBs: not left until the session ends


@pytest.fixture(scope="module")
def moved_version_dir(build_out: Path, tmp_path_factory: pytest.TempPathFactory
                      ) -> Iterator[Path]:
    """The model's folder moved to an unrelated place, with the rest of the build deleted:
    only relative external-data paths still resolve."""
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "served-models"
    elsewhere.mkdir()
    shutil.move(str(build_out / "model_repository" / MODEL), str(elsewhere / MODEL))
    shutil.rmtree(build_out)
    yield elsewhere / MODEL / "1"
    shutil.rmtree(elsewhere, ignore_errors=True)


def _external_locations(model_path: Path) -> dict[str, list[str]]:
    """location -> names of the initializers stored there."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    locations: dict[str, list[str]] = {}
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entry = {e.key: e.value for e in tensor.external_data}
            locations.setdefault(entry["location"], []).append(tensor.name)
    return locations


def test_build_exits_zero(build_out: Path) -> None:
    import json

    assert (build_out / "model_repository" / MODEL / "config.pbtxt").is_file()
    assert (build_out / "model_repository" / MODEL / "1" / "model.onnx").is_file()
    report = json.loads((build_out / "report.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    # onnxsim works on the graph alone: a model over 2 GB is simplified like any other
    assert stages["simplify"]["status"] == "ok", stages["simplify"]
    assert stages["simplify"]["metrics"]["external_data"] is True
    assert stages["simplify"]["metrics"]["weights_outside_onnxsim"] >= 1
    assert stages["export"]["status"] == stages["verify"]["status"] == "ok"
    assert all(s["peak_memory_mb"] for s in report["stages"] if s["status"] == "ok")
    rows = [r for r in report["verification"] if r["check"] == "onnx-vs-torch"]
    assert rows and all(r["passed"] for r in rows)


def test_version_folder_holds_the_model_and_its_external_data(moved_version_dir: Path
                                                              ) -> None:
    model_path = moved_version_dir / "model.onnx"
    assert model_path.is_file()
    # the graph is small; the weights are elsewhere
    assert model_path.stat().st_size < 1_000_000
    locations = _external_locations(model_path)
    assert list(locations) == ["model.onnx.data"], locations
    data = moved_version_dir / "model.onnx.data"
    assert data.is_file()
    assert data.stat().st_size > PROTOBUF_LIMIT
    # readable by a tritonserver running as another user (a 0600 data file would not load)
    assert data.stat().st_mode & 0o044 == 0o044, oct(data.stat().st_mode)
    assert "embeddings.weight" in " ".join(locations["model.onnx.data"])
    # nothing but the model and its weights: Triton's onnxruntime backend loads the folder
    assert sorted(p.name for p in moved_version_dir.iterdir()) == ["model.onnx",
                                                                   "model.onnx.data"]


def _realistic_inputs(vocab_size: int, batch: int, sequence: int, seed: int
                      ) -> dict[str, np.ndarray]:
    """Token ids over the whole vocabulary (the last rows too) and right-padded masks of
    different lengths, one row fully unpadded and one of a single token."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size, size=(batch, sequence), dtype=np.int64)
    ids[0, 0] = vocab_size - 1
    lengths = rng.integers(1, sequence + 1, size=batch)
    lengths[0] = sequence
    if batch > 1:
        lengths[1] = 1
    mask = (np.arange(sequence)[None, :] < lengths[:, None]).astype(np.int64)
    ids = np.where(mask == 1, ids, 0)
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize(("batch", "sequence"), [(1, 16), (4, 64), (8, 128)])
def test_moved_repository_runs_in_onnxruntime_like_torch(
    moved_version_dir: Path, big_model: Any, batch: int, sequence: int
) -> None:
    import onnxruntime as ort
    import torch

    session = ort.InferenceSession(str(moved_version_dir / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    inputs = _realistic_inputs(big_model.vocab_size, batch, sequence, seed=batch)
    (got,) = session.run([OUTPUT], inputs)
    with torch.inference_mode():
        want = big_model(*(torch.from_numpy(inputs[k]) for k in ("input_ids",
                                                                "attention_mask"))).numpy()
    assert got.shape == want.shape == (batch, 256)
    assert np.abs(got - want).max() < 1e-5
    cosine = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosine.min() > 0.99999


def test_factory_is_deterministic_and_past_the_protobuf_limit(big_model: Any) -> None:
    import torch

    from trtpack.testing.models import big_embedding_model

    weight_bytes = sum(t.numel() * t.element_size() for t in big_model.state_dict().values())
    assert weight_bytes > PROTOBUF_LIMIT
    inputs = _realistic_inputs(big_model.vocab_size, 2, 8, seed=0)
    args = [torch.from_numpy(inputs[k]) for k in ("input_ids", "attention_mask")]
    again = big_embedding_model()
    with torch.inference_mode():
        assert torch.equal(big_model(*args), again(*args))


def test_fp16_variant_of_the_large_model_builds_and_runs_from_its_folder(
    tmp_path: Path, big_model: Any, big_cache: Path
) -> None:
    """The precision stage on a model over 2 GB: AutoCast sees the graph alone, the weights
    it keeps in FP32 (the embedding lookup, whose ids exceed FP16's safe range) are copied
    into the variant's own data file, and the served folder runs on its own. (After the FP32
    build, its export, simplify and verify come from the module's cache.)"""
    import json

    import onnxruntime as ort
    import torch

    out = _build(tmp_path / "out", "fp16", big_cache)
    report = json.loads((out / "report.json").read_text())
    precision = next(s for s in report["stages"] if s["name"] == "precision")
    assert precision["status"] == "ok", precision
    assert precision["metrics"]["kept_fp32_out_of_range"]  # the lookup, at least
    version = tmp_path / "served" / MODEL / "1"
    shutil.move(str(out / "model_repository" / MODEL / "1"), str(version))
    shutil.rmtree(out)
    assert sorted(p.name for p in version.iterdir()) == ["model.onnx", "model.onnx.data"]
    assert (version / "model.onnx.data").stat().st_size > PROTOBUF_LIMIT
    session = ort.InferenceSession(str(version / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    inputs = _realistic_inputs(big_model.vocab_size, 4, 64, seed=11)
    (got,) = session.run([OUTPUT], inputs)
    with torch.inference_mode():
        want = big_model(*(torch.from_numpy(inputs[k]) for k in ("input_ids",
                                                                "attention_mask"))).numpy()
    cosine = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert got.dtype == np.float32 and cosine.min() > 0.999
