"""`trtpack build minilm --target cpu --serve text` end to end: the repository it writes is
valid by Triton's schema, and its tokenizer model, served by a real tritonserver, gives the
transformers token ids."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_cli
from tests.serving.conftest import servable_copy
from tests.serving.tritonserver import TritonServer
from trtpack.model_io import model_io_from_onnx
from trtpack.serving.config import check_config, read_config
from trtpack.serving.ensemble import check_ensemble
from trtpack.serving.layout import ModelRepository, ServedModel


def test_serve_text_for_a_model_without_tokenizer_is_exit_2(tmp_path: Path) -> None:
    result = run_cli("build", "resnet-50", "--random-weights", "--target", "cpu",
                     "--serve", "text", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert "--serve text needs a tokenizer" in result.output
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """The build in the session cache: --serve text changes only what the package stage
    writes (the subject here); the stages before it are minilm's CPU build's
    (tests/test_minilm.py's), reused when that ran first, stored for it otherwise."""
    out = tmp_path_factory.mktemp("cli-text") / "out"
    result = run_cli("build", "minilm", "--target", "cpu", "--serve", "text", "--out", str(out),
                     "--cache-dir", str(cache_dir))
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.slow
def test_cli_text_repository_is_valid(built: Path) -> None:
    repo = built / "model_repository"
    assert sorted(p.name for p in repo.iterdir()) == [
        "minilm", "minilm_ensemble", "minilm_postprocess", "minilm_tokenizer"]
    model = read_config(repo / "minilm" / "config.pbtxt")
    assert check_config(model, model_io_from_onnx(repo / "minilm" / "1" / "model.onnx")) == []
    assert check_ensemble(repo, "minilm_ensemble") == []
    assert (built / "tuning" / "perf_analyzer.sh").is_file()


@pytest.mark.slow
@pytest.mark.triton
def test_cli_text_repository_tokenizer_served(
        built: Path, tmp_path: Path, triton_server: Callable[[Path], TritonServer],
        minilm_dir: Path) -> None:
    import tritonclient.http as httpclient
    from transformers import AutoTokenizer

    root = built / "model_repository"
    models = []
    for p in sorted(root.iterdir()):
        config = read_config(p / "config.pbtxt")
        models.append(ServedModel(p.name, "model", p, config.platform or config.backend))
    repo = ModelRepository(root, models)  # minilm runs through the ONNX Runtime stand-in
    server = triton_server(servable_copy([repo], tmp_path / "served"))
    sentences = ["The tokenizer of the CLI build.", "Zweite Zeile, ünïcödé.", "x " * 200]
    text = httpclient.InferInput("TEXT", [3, 1], "BYTES")
    text.set_data_from_numpy(np.array([[s.encode()] for s in sentences], dtype=np.object_))
    client = server.client()
    try:
        ids = client.infer("minilm_tokenizer", [text]).as_numpy("input_ids")
    finally:
        client.close()
    expected = AutoTokenizer.from_pretrained(str(minilm_dir))(
        sentences, padding="max_length", truncation=True, max_length=128, return_tensors="np")
    np.testing.assert_array_equal(ids, expected["input_ids"])


@pytest.mark.slow
def test_cli_tuning_files_point_at_the_built_repository(built: Path) -> None:
    import yaml

    tuning = built / "tuning"
    config = yaml.safe_load((tuning / "model_analyzer_p0.yaml").read_text())
    assert (tuning / config["model_repository"]).resolve() == (built / "model_repository"
                                                                ).resolve()
