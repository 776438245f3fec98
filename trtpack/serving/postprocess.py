"""The post-processing model of a ``--serve text`` repository, chosen by the rule of the
recipe's head (``Head.postprocess`` in ``trtpack.sources.heads``): ``embedding``, mean pooling + L2
norm (feature-extraction, sentence-embedding); ``classify``, softmax, sigmoid or raw scores +
label names (sequence-classification, by transformers' rule: ``classification_function``);
``token_labels``, the top label of every token (token-classification);
``vocabulary_tokens``, the top-1 token at every position (fill-mask). The Python backend
code is ``templates/postprocess.py``: it runs inside Triton, so it gets the mode from its
``config.pbtxt`` parameters.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from trtpack.errors import UserInputError
from trtpack.model_io import ModelIO, TensorIO
from trtpack.serving.config import python_model_config
from trtpack.serving.tokenizer_model import TokenField
from trtpack.shapes import ShapeProfile
from trtpack.sources.heads import head_for
from trtpack.sources.recipe import Recipe, TritonSettings

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


EMBEDDING_OUTPUT = "embedding"
PROBABILITIES_OUTPUT = "probabilities"
LABEL_OUTPUT = "label"
LABELS_FILE = "labels.json"
TOKENS_OUTPUT = "tokens"  # fill-mask: the top-1 token at every position
TOKEN_LABELS_OUTPUT = "labels"  # token classification: the top label of every token

PostprocessMode = Literal["mean_pooling", "normalize", "softmax", "sigmoid", "identity",
                          "token_argmax"]
CLASSIFY_MODES = ("softmax", "sigmoid", "identity")
"""Sequence-classification modes: the function applied to the logits before the top label."""


@dataclass(frozen=True)
class Postprocessing:
    """What the post-processing model does: its mode, the tensors it reads and writes."""

    mode: PostprocessMode
    values: TensorIO
    mask: TensorIO | None
    outputs: tuple[TensorIO, ...]
    labels: tuple[str, ...] = ()

    def io(self) -> ModelIO:
        inputs = (self.values,) if self.mask is None else (self.values, self.mask)
        return ModelIO(inputs, self.outputs)

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]


def labels_from_config(model_config_json: Path | None, count: int) -> tuple[str, ...]:
    """Label names from a config.json's id2label (``LABEL_i`` where it has none)."""
    id2label: dict[str, str] = {}
    if model_config_json is not None and model_config_json.is_file():
        try:
            data = json.loads(model_config_json.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise UserInputError(f"cannot read {model_config_json}: {e}") from None
        id2label = {str(k): str(v) for k, v in (data.get("id2label") or {}).items()}
    return tuple(id2label.get(str(i), f"LABEL_{i}") for i in range(count))


def classification_function(model_config_json: Path | None, count: int) -> PostprocessMode:
    """transformers' ``TextClassificationPipeline.postprocess`` with no ``function_to_apply``
    (``transformers/pipelines/text_classification.py`` lines 183-193, transformers 5.24):
    ``problem_type == "regression"`` -> the raw scores; ``multi_label_classification`` or
    one label -> sigmoid (so a one-logit head whose config.json names no problem_type, a
    reranker, gets sigmoid); ``single_label_classification`` or more labels -> softmax.
    (Its last branches, the config's ``function_to_apply`` and none, are reached only with
    no labels.) ``tests/serving/test_postprocess_rules.py`` checks each branch against the
    pipeline itself."""
    problem_type = None
    if model_config_json is not None and model_config_json.is_file():
        try:
            data = json.loads(model_config_json.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise UserInputError(f"cannot read {model_config_json}: {e}") from None
        problem_type = data.get("problem_type") if isinstance(data, dict) else None
    if problem_type == "regression":
        return "identity"
    if problem_type == "multi_label_classification" or count == 1:
        return "sigmoid"
    return "softmax"


def vocabulary(tokenizer_dir: Path | None) -> tuple[str, ...]:
    """The tokenizer's tokens by id (tokenizer.json, else vocab.txt, else vocab.json)."""
    if tokenizer_dir is not None and (tokenizer_dir / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        vocab = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab(True)
        tokens = [""] * (max(vocab.values()) + 1)
        for token, index in vocab.items():
            tokens[index] = token
        return tuple(tokens)
    if tokenizer_dir is not None and (tokenizer_dir / "vocab.txt").is_file():
        return tuple((tokenizer_dir / "vocab.txt").read_text(encoding="utf-8").splitlines())
    if tokenizer_dir is not None and (tokenizer_dir / "vocab.json").is_file():  # GPT-2 style
        by_token = json.loads((tokenizer_dir / "vocab.json").read_text(encoding="utf-8"))
        tokens = [""] * (max(by_token.values()) + 1)
        for token, index in by_token.items():
            tokens[index] = token
        return tuple(tokens)
    raise UserInputError(f"--serve text: no tokenizer.json, vocab.txt or vocab.json in "
                         f"{tokenizer_dir} to name the predicted tokens")


def _token_argmax(values: TensorIO, batched: bool, output: str, names: Sequence[str]
                  ) -> Postprocessing:
    if len(values.shape) != 3:
        raise UserInputError(f"--serve text: output '{values.name}' has shape "
                             f"{list(values.shape)}; expected [batch, sequence, classes]")
    if values.shape[-1] > 0 and len(names) < values.shape[-1]:
        names = [*names, *(f"<{i}>" for i in range(len(names), values.shape[-1]))]
    return Postprocessing("token_argmax", values, None,
                           (TensorIO(output, "bytes", (-1, -1), batched),), tuple(names))


def postprocessing(recipe: Recipe, model_io: ModelIO, fields: Mapping[str, TokenField],
                     model_config_json: Path | None, tokenizer_dir: Path | None = None
                     ) -> Postprocessing | None:
    """The post-processing the task calls for, or None (the ensemble returns raw outputs)."""
    if not model_io.outputs:
        return None
    values = model_io.outputs[0]
    batched = model_io.all_batched
    head = head_for(recipe.task)
    rule = head.postprocess if head is not None else "none"
    if rule == "token_labels":
        return _token_argmax(values, batched, TOKEN_LABELS_OUTPUT,
                             labels_from_config(model_config_json, values.shape[-1]))
    if rule == "vocabulary_tokens":
        return _token_argmax(values, batched, TOKENS_OUTPUT, vocabulary(tokenizer_dir))
    if rule == "embedding":
        hidden = values.shape[-1]
        out = TensorIO(EMBEDDING_OUTPUT, "float32", (-1, hidden), batched)
        if len(values.shape) == 3:
            mask_name = next((n for n, f in fields.items() if f == "attention_mask"), None)
            if mask_name is None:
                raise UserInputError(
                    f"--serve text: mean pooling of '{values.name}' needs an attention_mask "
                    f"input, and model '{recipe.name}' has none"
                )
            mask = next(t for t in model_io.inputs if t.name == mask_name)
            return Postprocessing("mean_pooling", values, mask, (out,))
        if len(values.shape) == 2:
            return Postprocessing("normalize", values, None, (out,))
        return None
    if rule == "classify":
        if len(values.shape) != 2 or values.shape[-1] <= 0:
            raise UserInputError(
                f"--serve text: output '{values.name}' has shape {list(values.shape)}; "
                "a classifier's logits must be [batch, labels]"
            )
        count = values.shape[-1]
        return Postprocessing(
            classification_function(model_config_json, count), values, None,
            (TensorIO(PROBABILITIES_OUTPUT, "float32", (-1, count), batched),
             TensorIO(LABEL_OUTPUT, "bytes", (-1, 1), batched)),
            labels_from_config(model_config_json, count),
        )
    return None


def postprocess_config(name: str, post: Postprocessing, profiles: Sequence[ShapeProfile],
                       settings: TritonSettings) -> ModelConfig:
    params = {"mode": post.mode, "values_input": post.values.name,
              "output": post.outputs[0].name}
    if post.mask is not None:
        params["mask_input"] = post.mask.name
    if post.mode in CLASSIFY_MODES:
        params["labels_file"] = LABELS_FILE
        params["label_output"] = LABEL_OUTPUT
    if post.mode == "token_argmax":
        params["labels_file"] = LABELS_FILE
    return python_model_config(name, post.io(), profiles, settings, params)
