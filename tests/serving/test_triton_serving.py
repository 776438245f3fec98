"""Every Python-backend model trtpack writes, loaded by a real tritonserver and called over
HTTP with tritonclient; the ensembles run end to end.

What the bundled server cannot load, and how that is covered: it has no TensorRT and no
ONNX Runtime backend, so the model itself (``onnxruntime_onnx``) is served by a test
stand-in (``ort_standin_model.py``: the same model.onnx on ONNX Runtime through the Python
backend), and TensorRT ``model.plan`` configs are only checked against the schema
(test_serving_repository.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.serving.conftest import CLASSIFIER_LABELS, BuiltModel, servable_copy
from tests.serving.tritonserver import TritonServer, bundled_backends
from trtpack.serving.layout import ModelRepository

pytestmark = pytest.mark.triton

SENTENCES = [
    "A man is playing a guitar.",
    "Héllo wörld — naïve café, 東京!",
    "",
    "word " * 300,  # past the profiles' 128-token maximum: truncated
]


@pytest.fixture(scope="module")
def server(triton_server: Callable[..., TritonServer], minilm_text_repo: ModelRepository,
           classifier_text_repo: ModelRepository, unbatched_text_repo: ModelRepository,
           tmp_path_factory: pytest.TempPathFactory) -> TritonServer:
    repo = servable_copy([minilm_text_repo, classifier_text_repo, unbatched_text_repo],
                         tmp_path_factory.mktemp("served") / "repository")
    return triton_server(repo)


def _infer(server: TritonServer, model: str, inputs: dict[str, np.ndarray],
           outputs: list[str]) -> dict[str, np.ndarray]:
    import tritonclient.http as httpclient
    from tritonclient.utils import np_to_triton_dtype

    client = server.client()
    try:
        req = []
        for name, value in inputs.items():
            t = httpclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
            t.set_data_from_numpy(value)
            req.append(t)
        result = client.infer(model, req, outputs=[httpclient.InferRequestedOutput(o)
                                                   for o in outputs])
        return {o: result.as_numpy(o) for o in outputs}
    finally:
        client.close()


def _text(sentences: list[str]) -> np.ndarray:
    return np.array([[s.encode("utf-8")] for s in sentences], dtype=np.object_)


def test_every_model_is_ready(server: TritonServer, minilm_text_repo: ModelRepository,
                              classifier_text_repo: ModelRepository) -> None:
    client = server.client()
    try:
        for repo in (minilm_text_repo, classifier_text_repo):
            for m in repo.models:
                assert client.is_model_ready(m.name), (m.name, server.log()[-3000:])
    finally:
        client.close()
    assert server.start_seconds < 60


def test_tokenizer_model_returns_the_transformers_token_ids(
        server: TritonServer, minilm: BuiltModel) -> None:
    from transformers import AutoTokenizer

    out = _infer(server, "minilm_tokenizer", {"TEXT": _text(SENTENCES)},
                 ["input_ids", "attention_mask", "token_type_ids"])
    reference = AutoTokenizer.from_pretrained(str(minilm.hf_dir))
    # the served model pads to the longest sentence, at least 8 (profile min), at most 128
    expected = reference(SENTENCES, padding="max_length", truncation=True, max_length=128,
                         return_tensors="np")
    assert out["input_ids"].dtype == np.int64
    np.testing.assert_array_equal(out["input_ids"], expected["input_ids"])
    np.testing.assert_array_equal(out["attention_mask"], expected["attention_mask"])
    np.testing.assert_array_equal(out["token_type_ids"], expected["token_type_ids"])


def test_tokenizer_pads_short_batches_to_the_profile_minimum(
        server: TritonServer, minilm: BuiltModel) -> None:
    from transformers import AutoTokenizer

    out = _infer(server, "minilm_tokenizer", {"TEXT": _text(["Hi", "Hello there"])},
                 ["input_ids", "attention_mask"])
    assert out["input_ids"].shape == (2, 8)  # profile 1x8:4x32:8x128: sequence >= 8
    expected = AutoTokenizer.from_pretrained(str(minilm.hf_dir))(
        ["Hi", "Hello there"], padding="max_length", max_length=8, return_tensors="np")
    np.testing.assert_array_equal(out["input_ids"], expected["input_ids"])
    np.testing.assert_array_equal(out["attention_mask"], expected["attention_mask"])


def test_ensemble_returns_the_sentence_transformers_embeddings(
        server: TritonServer, minilm: BuiltModel) -> None:
    from sentence_transformers import SentenceTransformer

    sentences = [*SENTENCES[:2], "The cat sits outside.", "A woman watches TV."]
    out = _infer(server, "minilm_ensemble", {"TEXT": _text(sentences)}, ["embedding"])
    got = out["embedding"]
    assert got.shape == (4, 384) and got.dtype == np.float32
    st = SentenceTransformer(str(minilm.hf_dir), device="cpu")
    want = st.encode(sentences, normalize_embeddings=True, convert_to_numpy=True)
    cosine = (got * want).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() > 0.9999, cosine
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_classifier_ensemble_returns_probabilities_and_label_names(
        server: TritonServer, classifier: BuiltModel) -> None:
    import onnxruntime as ort
    from transformers import AutoTokenizer

    sentences = ["I loved it", "It was terrible, truly the worst", "okay"]
    out = _infer(server, "tiny-classifier_ensemble", {"TEXT": _text(sentences)},
                 ["probabilities", "label"])
    tok = AutoTokenizer.from_pretrained(str(classifier.hf_dir))
    length = max(4, *(len(ids) for ids in tok(sentences)["input_ids"]))  # profile min 4
    enc = tok(sentences, padding="max_length", max_length=length, return_tensors="np")
    session = ort.InferenceSession(str(classifier.onnx), providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], {k: enc[k].astype(np.int64) for k in
                                      ("input_ids", "attention_mask", "token_type_ids")})[0]
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out["probabilities"], probs, atol=1e-5)
    labels = [b.decode() for b in out["label"].reshape(-1)]
    assert labels == [CLASSIFIER_LABELS[int(i)] for i in probs.argmax(axis=1)]


def test_left_padding_tokenizer_matches_transformers(server: TritonServer,
                                                     classifier: BuiltModel) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(classifier.hf_dir))
    assert tok.padding_side == "left"
    sentences = ["short", "a somewhat longer sentence than that", "word " * 100]
    out = _infer(server, "tiny-classifier_tokenizer", {"TEXT": _text(sentences)},
                 ["input_ids", "attention_mask"])
    expected = tok(sentences, padding="max_length", truncation=True, max_length=64,
                   return_tensors="np")  # profile 1x4:2x16:4x64: the long one is cut at 64
    np.testing.assert_array_equal(out["input_ids"], expected["input_ids"])
    np.testing.assert_array_equal(out["attention_mask"], expected["attention_mask"])
    assert out["attention_mask"][0, 0] == 0 and out["attention_mask"][0, -1] == 1


def test_postprocess_softmax_served_alone(server: TritonServer) -> None:
    logits = np.array([[0.0, 1.0, 2.0], [5.0, 0.0, 0.0]], dtype=np.float32)
    out = _infer(server, "tiny-classifier_postprocess", {"logits": logits},
                 ["probabilities", "label"])
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out["probabilities"], e / e.sum(axis=1, keepdims=True), atol=1e-6)
    assert [b.decode() for b in out["label"].reshape(-1)] == ["positive", "negative"]


def test_unbatched_model_serves_text_too(server: TritonServer) -> None:
    texts = np.array([s.encode() for s in SENTENCES[:2]], dtype=np.object_)  # [texts], no batch
    batched = _infer(server, "minilm_ensemble", {"TEXT": _text(SENTENCES[:2])}, ["embedding"])
    out = _infer(server, "minilm-nobatch_ensemble", {"TEXT": texts}, ["embedding"])
    np.testing.assert_allclose(out["embedding"], batched["embedding"], atol=1e-5)


def test_more_texts_than_the_profiles_take_is_an_error(server: TritonServer) -> None:
    from tritonclient.utils import InferenceServerException

    texts = np.array([b"one text"] * 9, dtype=np.object_)  # profile 1x8:4x32:8x128: at most 8
    with pytest.raises(InferenceServerException, match="at most 8"):
        _infer(server, "minilm-nobatch_tokenizer", {"TEXT": texts}, ["input_ids"])


def test_a_bad_request_is_an_error_and_the_server_keeps_serving(server: TritonServer) -> None:
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException):
        _infer(server, "minilm_postprocess",
               {"last_hidden_state": np.zeros((1, 3, 384), np.float32)}, ["embedding"])
    out = _infer(server, "minilm_tokenizer", {"TEXT": _text(["still here"])}, ["input_ids"])
    assert out["input_ids"].shape == (1, 8)


def test_ensemble_latency_is_bounded(server: TritonServer) -> None:
    """A bounded loop of requests (20) through the whole text path."""
    text = _text(["A short sentence to embed."])
    _infer(server, "minilm_ensemble", {"TEXT": text}, ["embedding"])
    times = []
    for _ in range(20):
        started = time.perf_counter()
        _infer(server, "minilm_ensemble", {"TEXT": text}, ["embedding"])
        times.append(time.perf_counter() - started)
    assert float(np.median(times)) < 1.0, times


def test_serving_options_are_accepted_by_the_server(
        triton_server: Callable[..., TritonServer], minilm: BuiltModel, tmp_path: Path) -> None:
    """Instances, queue delay, warmup, version policy and the response cache, as written."""
    settings = minilm.recipe.triton.model_copy(update={
        "instance_count": 2, "max_queue_delay_us": 500, "response_cache": True,
        "warmup": True, "version_policy": "all"})
    repo = minilm.write(tmp_path / "repo", settings=settings, serve="text")
    server = triton_server(servable_copy([repo], tmp_path / "served"), cache_bytes=16 << 20)
    text = _text(["cache me", "and me"])
    first = _infer(server, "minilm_ensemble", {"TEXT": text}, ["embedding"])["embedding"]
    second = _infer(server, "minilm_ensemble", {"TEXT": text}, ["embedding"])["embedding"]
    np.testing.assert_array_equal(first, second)
    client = server.client()
    try:
        stats = client.get_inference_statistics("minilm_ensemble")["model_stats"][0]
        config = client.get_model_config("minilm")
    finally:
        client.close()
    assert int(stats["inference_stats"]["cache_hit"]["count"]) == 1, stats
    assert config["instance_group"][0]["count"] == 2
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert config["model_warmup"][0]["name"] == "profile_0_opt"
    assert config["version_policy"] == {"all": {}}


def test_onnxruntime_backend_serves_the_model_as_written(
        triton_server: Callable[..., TritonServer], minilm: BuiltModel,
        tmp_path: Path) -> None:
    """The model with trtpack's own config (platform onnxruntime_onnx), no stand-in."""
    if "onnxruntime" not in bundled_backends():
        pytest.skip("nvidia-pytriton's tritonserver has no onnxruntime backend (it bundles "
                    f"{sorted(bundled_backends())}): trtpack's onnxruntime_onnx config is "
                    "checked against Triton's schema, and its model.onnx is served through "
                    "the Python-backend stand-in in the other tests")
    import onnxruntime as ort
    from transformers import AutoTokenizer

    repo = minilm.write(tmp_path / "repository", serve="tensor")
    server = triton_server(repo.root)
    enc = AutoTokenizer.from_pretrained(str(minilm.hf_dir))(SENTENCES[:2], padding=True,
                                                             return_tensors="np")
    feed = {k: v.astype(np.int64) for k, v in enc.items()}
    name = minilm.recipe.name
    output = minilm.recipe.outputs[0].name
    got = _infer(server, name, feed, [output])[output]
    (expected,) = ort.InferenceSession(str(minilm.onnx)).run([output], feed)
    np.testing.assert_allclose(got, expected, atol=1e-4)
