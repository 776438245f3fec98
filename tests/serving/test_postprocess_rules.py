"""Sequence-classification post-processing follows transformers' ``TextClassificationPipeline``
rule (issue 25, item 12): softmax for single-label heads, sigmoid for multi-label heads and
for single-logit heads (rerankers), raw scores for regression. The generated ``model.py`` is
run on the logits of a real (tiny, random-weight) PyTorch model and compared with the
pipeline's own answer on the same text."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.hf_models import TINY_TEXT, copy_tokenizer
from tests.serving.python_models import run_python_model
from trtpack.model_io import ModelIO, TensorIO
from trtpack.serving.config import write_config
from trtpack.serving.postprocess import LABELS_FILE, postprocess_config, postprocessing
from trtpack.serving.tokenizer_model import TEMPLATES_DIR
from trtpack.shapes import TensorSpec, parse_profile
from trtpack.sources.recipe import TritonSettings

TEXTS = ["Thank you very much!", "The shipment arrived two days late and the box was crushed.",
         "Yes."]


def _classifier(folder: Path, num_labels: int, problem_type: str | None) -> object:
    import torch
    import transformers

    torch.manual_seed(7)
    config = transformers.BertConfig(**TINY_TEXT, num_labels=num_labels)
    if problem_type is not None:
        config.problem_type = problem_type
    model = transformers.BertForSequenceClassification(config).eval()
    folder.mkdir()
    model.save_pretrained(folder)
    copy_tokenizer(folder)
    return model


def _postprocess_model(folder: Path, dest: Path, num_labels: int) -> str:
    from trtpack.sources.resolve import resolve_model

    recipe = resolve_model(str(folder))
    io = ModelIO((TensorIO("input_ids", "int64", (-1, -1), True),),
                 (TensorIO("logits", "float32", (-1, num_labels), True),))
    post = postprocessing(recipe, io, {"input_ids": "ids"}, folder / "config.json")
    assert post is not None
    profiles = [parse_profile("1x8:2x16:4x32", [TensorSpec("input_ids", "int64",
                                                           ("batch", "sequence"))])]
    (dest / "1").mkdir(parents=True)
    write_config(dest / "config.pbtxt", postprocess_config("post", post, profiles,
                                                           TritonSettings()))
    shutil.copyfile(TEMPLATES_DIR / "postprocess.py", dest / "1" / "model.py")
    (dest / "1" / LABELS_FILE).write_text(json.dumps(list(post.labels)), encoding="utf-8")
    return post.mode


@pytest.mark.parametrize(("num_labels", "problem_type", "mode"), [
    (3, None, "softmax"),
    (1, None, "sigmoid"),  # a reranker's single logit: softmax would always give 1.0
    (3, "multi_label_classification", "sigmoid"),
    (1, "regression", "identity"),
])
def test_classifier_postprocess_matches_the_transformers_pipeline(
        num_labels: int, problem_type: str | None, mode: str, tmp_path: Path) -> None:
    import torch
    import transformers

    folder = tmp_path / "model"
    model = _classifier(folder, num_labels, problem_type)
    assert _postprocess_model(folder, tmp_path / "post", num_labels) == mode
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    pipe = transformers.pipeline("text-classification", model=model, tokenizer=tokenizer)
    for text in TEXTS:
        with torch.inference_mode():
            logits = model(**tokenizer(text, return_tensors="pt")).logits.numpy()
        out = run_python_model(tmp_path / "post", {"logits": logits})
        expected = pipe(text)[0]
        assert out["label"][0][0].decode() == expected["label"], text
        scores = out["probabilities"][0]
        np.testing.assert_allclose(scores.max(), expected["score"], rtol=1e-5, atol=1e-6)
        if mode == "softmax":
            np.testing.assert_allclose(scores.sum(), 1.0, rtol=1e-5)
        elif num_labels == 1 and mode == "sigmoid":
            assert 0.0 < scores[0] < 1.0  # the old softmax said 1.0 for every text
