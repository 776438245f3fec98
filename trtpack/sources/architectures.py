"""What trtpack knows of each transformers architecture family, as one declarative table
(modelled on Optimum's ``model_configs.py``, one entry per family): which ``config.json`` keys
hold its hidden size and its longest sequence, whether it takes ``token_type_ids``, and the
shape of a vision base model's pooled output. ``trtpack.sources.hf_recipe`` reads config.json
through it; a model type not in the table gets ``DEFAULT``, which tries every family's keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HIDDEN_SIZE_KEYS = ("hidden_size", "dim", "n_embd", "d_model")
"""config.json keys that hold a text model's hidden size, in the order they are tried."""
HEAD_COUNT_KEYS = ("num_attention_heads", "n_heads", "n_head", "encoder_attention_heads")
"""config.json keys that hold a text model's number of attention heads."""
POSITION_KEYS = ("max_position_embeddings", "n_positions")
"""config.json keys that hold the longest sequence a text model takes."""
LAYERS_KEYS = ("num_hidden_layers", "n_layer", "n_layers")
"""config.json keys that hold a transformer's layers."""
DEFAULT_HIDDEN_SIZE = 768
DEFAULT_VOCAB_SIZE = 30522  # BERT's
DEFAULT_POSITIONS = 512
DEFAULT_IMAGE_SIZE = 224


@dataclass(frozen=True)
class Architecture:
    """One architecture family: the ``model_type`` values of its config.json and its facts."""

    model_types: tuple[str, ...]
    hidden_size_keys: tuple[str, ...] = HIDDEN_SIZE_KEYS
    position_keys: tuple[str, ...] = POSITION_KEYS
    token_type_ids: bool = True  # takes token_type_ids when type_vocab_size >= 2
    pooled_spatial: bool = False  # a vision base model's pooler_output is [batch, hidden, 1, 1]


DEFAULT = Architecture(())

ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture(("bert",)),
    Architecture(("distilbert",), hidden_size_keys=("dim",), token_type_ids=False),
    Architecture(("roberta", "xlm-roberta", "camembert"), token_type_ids=False),
    Architecture(("deberta-v2",), token_type_ids=False),
    Architecture(("gpt2",), hidden_size_keys=("n_embd",), position_keys=("n_positions",),
                 token_type_ids=False),
    Architecture(("resnet", "regnet"), pooled_spatial=True),
)


def architecture(model_type: str) -> Architecture:
    """The table's entry for ``model_type`` (``DEFAULT`` when it has none)."""
    return next((a for a in ARCHITECTURES if model_type in a.model_types), DEFAULT)


def hidden_size(config: dict[str, Any]) -> int:
    """A text model's hidden size: the family's key, else any family's, else 768."""
    arch = architecture(str(config.get("model_type", "")))
    keys = (*arch.hidden_size_keys, *HIDDEN_SIZE_KEYS)
    return int(next((config[k] for k in keys if config.get(k)), DEFAULT_HIDDEN_SIZE))


def max_positions(config: dict[str, Any]) -> int:
    """The longest sequence a text model takes: the family's key, else any family's, else
    512."""
    arch = architecture(str(config.get("model_type", "")))
    keys = (*arch.position_keys, *POSITION_KEYS)
    return int(next((config[k] for k in keys if config.get(k)), DEFAULT_POSITIONS))


def attention_heads(config: dict[str, Any]) -> int | None:
    """A transformer's attention heads (None: the config does not say)."""
    return next((int(config[k]) for k in HEAD_COUNT_KEYS if config.get(k)), None)


def hidden_layers(config: dict[str, Any]) -> int | None:
    """A transformer's layers (None: the config does not say)."""
    return next((int(config[k]) for k in LAYERS_KEYS if config.get(k)), None)


def config_hidden_size(config: dict[str, Any]) -> int | None:
    """The hidden size the config states (None: it does not say; ``hidden_size`` guesses)."""
    arch = architecture(str(config.get("model_type", "")))
    return next((int(config[k]) for k in (*arch.hidden_size_keys, *HIDDEN_SIZE_KEYS)
                 if config.get(k)), None)


def head_split_problem(config: dict[str, Any]) -> str | None:
    """Why the hidden size cannot be split evenly across the attention heads (every
    transformers attention layer refuses it when the model is built), or None."""
    arch = architecture(str(config.get("model_type", "")))
    hidden_key = next((k for k in (*arch.hidden_size_keys, *HIDDEN_SIZE_KEYS)
                       if isinstance(config.get(k), int)), None)
    heads_key = next((k for k in HEAD_COUNT_KEYS if isinstance(config.get(k), int)), None)
    if hidden_key is None or heads_key is None or config[heads_key] <= 0:
        return None
    if config[hidden_key] % config[heads_key]:
        return (f"config.{hidden_key} {config[hidden_key]} is not a multiple of "
                f"config.{heads_key} {config[heads_key]} (each attention head takes an equal "
                "share of the hidden size)")
    return None


def vocab_size(config: dict[str, Any]) -> int:
    return int(config.get("vocab_size") or DEFAULT_VOCAB_SIZE)


def takes_token_type_ids(config: dict[str, Any]) -> bool:
    """Whether a text model has a ``token_type_ids`` input: its family uses them and its
    config has two types or more."""
    arch = architecture(str(config.get("model_type", "")))
    return arch.token_type_ids and int(config.get("type_vocab_size") or 0) >= 2


def vision_hidden_size(config: dict[str, Any]) -> int:
    """A vision model's pooled width: the last stage's (``hidden_sizes``, convolutional
    models) or ``hidden_size`` (ViT), else 768."""
    return int((config.get("hidden_sizes") or [config.get("hidden_size",
                                                           DEFAULT_HIDDEN_SIZE)])[-1])


def image_size(config: dict[str, Any]) -> int:
    size = config.get("image_size", DEFAULT_IMAGE_SIZE)
    return int(size[0] if isinstance(size, list) else size)


def pooler_axes(config: dict[str, Any]) -> list[str | int]:
    """The axes of a vision base model's ``pooler_output``."""
    hidden = vision_hidden_size(config)
    if architecture(str(config.get("model_type", ""))).pooled_spatial:
        return ["batch", hidden, 1, 1]
    return ["batch", hidden]
