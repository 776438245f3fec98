"""The text ensemble on a tritonserver whose Python has no ``tokenizers``, as in the stock NGC
and SageMaker Triton images: the tokenizer model carries the package (``1/vendor/``) and the
ensemble returns the sentence-transformers embeddings. The control: the same repository
without ``vendor/`` does not load there.

The server is the real tritonserver of ``tests/serving/tritonserver.py``; ``tokenizers`` is
hidden from its Python-backend models by a package first on PYTHONPATH that fails to import
(``hide_packages``), the venv's own copy staying unreachable. The model itself is served by
the ONNX Runtime stand-in (the bundle has no onnxruntime backend), as in
test_triton_serving.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.serving.conftest import BuiltModel, servable_copy
from tests.serving.tritonserver import TritonServer
from trtpack.serving.layout import ModelRepository
from trtpack.serving.tokenizer_model import VENDOR_FOLDER

pytestmark = pytest.mark.triton  # about 45 s here, both servers included

SENTENCES = ["A man is playing a guitar.", "Héllo wörld — naïve café, 東京!",
             "The cat sits outside.", "word " * 40]


def _embed(server: TritonServer, sentences: list[str]) -> np.ndarray:
    import tritonclient.http as httpclient

    text = np.array([[s.encode("utf-8")] for s in sentences], dtype=np.object_)
    client = server.client()
    try:
        request = httpclient.InferInput("TEXT", list(text.shape), "BYTES")
        request.set_data_from_numpy(text)
        result = client.infer("minilm_ensemble", [request],
                              outputs=[httpclient.InferRequestedOutput("embedding")])
        return result.as_numpy("embedding")  # type: ignore[no-any-return]
    finally:
        client.close()


def test_the_tokenizer_model_carries_tokenizers(minilm_text_repo: ModelRepository) -> None:
    vendor = minilm_text_repo.root / "minilm_tokenizer" / "1" / VENDOR_FOLDER / "tokenizers"
    assert (vendor / "__init__.py").is_file()
    binaries = list(vendor.glob("tokenizers*.so"))
    assert [b.name for b in binaries] == ["tokenizers.abi3.so"]  # one for Python 3.10+
    assert not minilm_text_repo.warnings


def test_ensemble_serves_from_a_python_without_tokenizers(
        triton_server: Callable[..., TritonServer], minilm_text_repo: ModelRepository,
        minilm: BuiltModel, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    repo = servable_copy([minilm_text_repo], tmp_path / "repository")
    server = triton_server(repo, hidden=("tokenizers",))
    got = _embed(server, SENTENCES)
    want = SentenceTransformer(str(minilm.hf_dir), device="cpu").encode(
        SENTENCES, normalize_embeddings=True, convert_to_numpy=True)
    assert got.shape == (len(SENTENCES), 384)
    cosine = (got * want).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() > 0.9999, cosine

    # the control: without the carried package the tokenizer model cannot load there
    bare = servable_copy([minilm_text_repo], tmp_path / "bare")
    shutil.rmtree(bare / "minilm_tokenizer" / "1" / VENDOR_FOLDER)
    with pytest.raises(RuntimeError) as failed:
        triton_server(bare, hidden=("tokenizers",))
    assert "No module named 'tokenizers'" in str(failed.value), str(failed.value)[-2000:]
