"""``trtpack.sources.architectures`` is the one table of per-family facts, and the recipe of a model
directory (``hf_recipe``) reads config.json through it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trtpack.sources.architectures import ARCHITECTURES, DEFAULT, architecture
from trtpack.sources.hf_recipe import recipe_for_hf_dir


def model_dir(tmp_path: Path, config: dict[str, Any]) -> Path:
    folder = tmp_path / str(config.get("model_type") or "model")
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.mark.parametrize(("config", "inputs", "hidden", "max_len"), [
    ({"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 48,
      "type_vocab_size": 2, "max_position_embeddings": 128},
     ["input_ids", "attention_mask", "token_type_ids"], 48, 128),
    ({"model_type": "distilbert", "architectures": ["DistilBertModel"], "dim": 40,
      "type_vocab_size": 2, "max_position_embeddings": 1024},
     ["input_ids", "attention_mask"], 40, 512),
    ({"model_type": "gpt2", "architectures": ["GPT2Model"], "n_embd": 32, "n_positions": 64,
      "type_vocab_size": 2}, ["input_ids", "attention_mask"], 32, 64),
    ({"model_type": "roberta", "architectures": ["RobertaModel"], "hidden_size": 24,
      "type_vocab_size": 2}, ["input_ids", "attention_mask"], 24, 512),
    # not in the table: every family's keys are tried
    ({"model_type": "xlnet", "architectures": ["XLNetModel"], "d_model": 16},
     ["input_ids", "attention_mask"], 16, 512),
])
def test_a_text_recipe_follows_its_family(tmp_path: Path, config: dict[str, Any],
                                          inputs: list[str], hidden: int, max_len: int) -> None:
    recipe = recipe_for_hf_dir(model_dir(tmp_path, config))
    assert [i.name for i in recipe.inputs] == inputs
    assert recipe.outputs[0].axes == ["batch", "sequence", hidden]
    assert recipe.profiles == [f"1x16:4x64:8x{max_len}"]


@pytest.mark.parametrize(("model_type", "pooled"), [
    ("resnet", ["batch", 32, 1, 1]), ("regnet", ["batch", 32, 1, 1]),
    ("convnext", ["batch", 32])])
def test_a_vision_base_model_pools_as_its_family(tmp_path: Path, model_type: str,
                                                  pooled: list[Any]) -> None:
    config = {"model_type": model_type, "num_channels": 3, "image_size": 64,
              "hidden_sizes": [8, 16, 32], "architectures": [f"{model_type.title()}Model"]}
    recipe = recipe_for_hf_dir(model_dir(tmp_path, config), task="feature-extraction")
    assert recipe.inputs[0].axes == ["batch", 3, 64, 64]
    assert [(o.name, o.axes) for o in recipe.outputs] == [("pooler_output", pooled)]


def test_each_model_type_has_one_entry_and_is_a_transformers_model_type() -> None:
    types = [t for a in ARCHITECTURES for t in a.model_types]
    assert len(types) == len(set(types))
    assert architecture("no-such-type") is DEFAULT
    auto = pytest.importorskip("transformers.models.auto.configuration_auto")
    assert [t for t in types if t not in auto.CONFIG_MAPPING_NAMES] == []
