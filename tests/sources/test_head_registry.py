"""``trtpack.sources.heads`` is the one task registry: a head registered there, and nowhere else, is
in ``--task``'s help, is a task a recipe may have, resolves with ``--task``, and gets its
``--serve text`` post-processing; every head's metric is one ``sample_metrics`` computes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pydantic
import pytest

from trtpack.model_io import ModelIO, TensorIO
from trtpack.serving.postprocess import PostprocessMode, postprocessing
from trtpack.sources import heads
from trtpack.sources.heads import Head, HeadOutput
from trtpack.sources.recipe import Metric, Recipe
from trtpack.verify.sample_metrics import SAMPLE_METRICS

ROOT = Path(__file__).resolve().parents[2]

FAKE = Head("review-rating", "review-rating (stars of a product review, a test head)",
            (HeadOutput("logits", ("batch", "labels"), "top1"),),
            "AutoModelForSequenceClassification",
            "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", postprocess="classify")
"""A head that exists only in this test."""


def recipe_data(task: str) -> dict[str, Any]:
    return {"name": "reviews", "task": task, "source": {"random_weights": True},
            "inputs": [{"name": "input_ids", "dtype": "int64", "axes": ["batch", "sequence"],
                        "kind": "token_ids"}],
            "outputs": heads.text_outputs(task, labels=5), "profiles": ["1x4:2x8:4x16"]}


def one_line(text: str) -> str:
    """Help text as one line: click wraps at spaces and after hyphens."""
    return re.sub(r"-\s+", "-", re.sub(r"\s+", " ", text))


@pytest.fixture
def fake_head(monkeypatch: pytest.MonkeyPatch) -> Head:
    monkeypatch.setitem(heads.REGISTRY, FAKE.task, FAKE)  # the one place
    return FAKE


def test_an_unregistered_task_is_refused_with_the_choices() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        Recipe.model_validate(recipe_data("review-rating"))
    (error,) = caught.value.errors()
    assert error["type"] == "literal_error" and error["loc"] == ("task",)
    assert error["msg"].startswith("Input should be 'sequence-classification', ")
    assert error["msg"].endswith("'sentence-embedding' or 'generic'")


def test_a_registered_head_is_a_recipe_task_and_a_task_option(fake_head: Head) -> None:
    recipe = Recipe.model_validate(recipe_data(fake_head.task))
    assert recipe.task == "review-rating"
    assert [(o.name, o.axes, o.metric) for o in recipe.outputs] == [
        ("logits", ["batch", 5], "top1")]
    from trtpack.errors import UserInputError
    from trtpack.sources.resolve import resolve_model

    with pytest.raises(UserInputError, match="is task feature-extraction"):
        resolve_model("tiny-bert", "review-rating")  # past --task's check: a known task


def test_a_registered_head_gets_its_postprocessing(fake_head: Head, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"id2label": {str(i): f"{i + 1} stars" for i in range(5)}}),
                      encoding="utf-8")
    recipe = Recipe.model_validate(recipe_data(fake_head.task))
    io = ModelIO((TensorIO("input_ids", "int64", (-1, -1), True),),
                 (TensorIO("logits", "float32", (-1, 5), True),))
    post = postprocessing(recipe, io, {"input_ids": "ids"}, config)
    assert post is not None and post.mode == "softmax"
    assert post.labels == ("1 stars", "2 stars", "3 stars", "4 stars", "5 stars")
    assert post.output_names == ["probabilities", "label"]
    raw = Recipe.model_validate({**recipe_data(fake_head.task), "task": "generic"})
    assert postprocessing(raw, io, {"input_ids": "ids"}, config) is None  # rule "none"


def test_a_head_registered_before_the_cli_is_in_task_help() -> None:
    """The real ``trtpack build --help`` of a process that registered the fake head."""
    code = ("from tests.sources.test_head_registry import FAKE\n"
            "from trtpack.sources.heads import register\n"
            "register(FAKE)\n"
            "from trtpack.cli.app import app\n"
            "app(['build', '--help'], prog_name='trtpack')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    help_text = one_line(done.stdout)
    assert "image-classification, feature-extraction, sentence-embedding, generic, " \
           "review-rating (stars of a product review, a test head)." in help_text


def test_task_help_names_every_head() -> None:
    from tests.conftest import run_cli

    result = run_cli("build", "--help")
    assert result.exit_code == 0
    help_text = one_line(result.stdout)
    for head in heads.heads():
        assert one_line(head.help) in help_text, head.task
    assert "text-generation (logits only, no KV cache: LLM decoding with a KV cache belongs " \
           "to TensorRT-LLM)" in help_text


def test_every_head_says_what_the_rest_of_trtpack_computes() -> None:
    rules = {"embedding": ("mean_pooling", "normalize"), "classify": ("softmax", "sigmoid",
                                                                      "identity"),
             "token_labels": ("token_argmax",), "vocabulary_tokens": ("token_argmax",)}
    assert set(get_args(heads.PostprocessRule)) == {"none", *rules}
    assert {m for modes in rules.values() for m in modes} == set(get_args(PostprocessMode))
    for head in heads.heads():
        for out in head.outputs:
            assert out.metric in SAMPLE_METRICS and out.metric in get_args(Metric), head.task
        assert (head.auto_class is None) == (head.mapping is None), head.task
    assert heads.suffix_heads()[0] == ("ForSequenceClassification",
                                       "sequence-classification")  # longest first
    assert heads.head_of_architecture("XLMWithLMHeadModel") == heads.REGISTRY["fill-mask"]
    assert heads.head_of_architecture("GPT2LMHeadModel") == heads.REGISTRY["text-generation"]


def test_every_auto_class_exists_in_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    for head in heads.transformers_heads():
        assert hasattr(transformers, str(head.auto_class)), head.task
        assert heads.transformers_table(head), head.task  # its mapping's name exists
