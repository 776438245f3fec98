"""What trtpack knows of each transformers architecture family, as one declarative table
(modelled on Optimum's ``model_configs.py``, one entry per family): which ``config.json`` keys
hold its hidden size and its longest sequence, whether it takes ``token_type_ids``, and the
shape of a vision base model's pooled output. ``trtpack.sources.hf_recipe`` reads config.json
through it; a model type not in the table gets ``DEFAULT``, which tries every family's keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trtpack.report import JsonObject, JsonValue

HIDDEN_SIZE_KEYS = ("hidden_size", "dim", "n_embd", "d_model")
"""config.json keys that hold a text model's hidden size, in the order they are tried."""
HEAD_COUNT_KEYS = ("num_attention_heads", "n_heads", "n_head", "encoder_attention_heads")
"""config.json keys that hold a text model's number of attention heads."""
POSITION_KEYS = ("max_position_embeddings", "n_positions")
"""config.json keys that hold the longest sequence a text model takes."""
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


def config_int(value: JsonValue) -> int:
    """A config.json number (or a number written as text) as an int."""
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"expected a number, got {value!r}")


def _model_type(config: JsonObject) -> str:
    return str(config.get("model_type", ""))


def architecture(model_type: str) -> Architecture:
    """The table's entry for ``model_type`` (``DEFAULT`` when it has none)."""
    return next((a for a in ARCHITECTURES if model_type in a.model_types), DEFAULT)


def hidden_size(config: JsonObject) -> int:
    """A text model's hidden size: the family's key, else any family's, else 768."""
    arch = architecture(_model_type(config))
    keys = (*arch.hidden_size_keys, *HIDDEN_SIZE_KEYS)
    return config_int(next((config[k] for k in keys if config.get(k)), DEFAULT_HIDDEN_SIZE))


def max_positions(config: JsonObject) -> int:
    """The longest sequence a text model takes: the family's key, else any family's, else
    512."""
    arch = architecture(_model_type(config))
    keys = (*arch.position_keys, *POSITION_KEYS)
    return config_int(next((config[k] for k in keys if config.get(k)), DEFAULT_POSITIONS))


def attention_heads(config: JsonObject) -> int | None:
    """A transformer's attention heads (None: the config does not say)."""
    return next((config_int(config[k]) for k in HEAD_COUNT_KEYS if config.get(k)), None)


def config_hidden_size(config: JsonObject) -> int | None:
    """The hidden size the config states (None: it does not say; ``hidden_size`` guesses)."""
    arch = architecture(_model_type(config))
    return next((config_int(config[k]) for k in (*arch.hidden_size_keys, *HIDDEN_SIZE_KEYS)
                 if config.get(k)), None)


def head_split_problem(config: JsonObject) -> str | None:
    """Why the hidden size cannot be split evenly across the attention heads (every
    transformers attention layer refuses it when the model is built), or None."""
    arch = architecture(_model_type(config))
    hidden_key = next((k for k in (*arch.hidden_size_keys, *HIDDEN_SIZE_KEYS)
                       if isinstance(config.get(k), int)), None)
    heads_key = next((k for k in HEAD_COUNT_KEYS if isinstance(config.get(k), int)), None)
    if hidden_key is None or heads_key is None:
        return None
    hidden, heads = config_int(config[hidden_key]), config_int(config[heads_key])
    if heads <= 0:
        return None
    if hidden % heads:
        return (f"config.{hidden_key} {config[hidden_key]} is not a multiple of "
                f"config.{heads_key} {config[heads_key]} (each attention head takes an equal "
                "share of the hidden size)")
    return None


def vocab_size(config: JsonObject) -> int:
    return config_int(config.get("vocab_size") or DEFAULT_VOCAB_SIZE)


def takes_token_type_ids(config: JsonObject) -> bool:
    """Whether a text model has a ``token_type_ids`` input: its family uses them and its
    config has two types or more."""
    arch = architecture(_model_type(config))
    return arch.token_type_ids and config_int(config.get("type_vocab_size") or 0) >= 2


def vision_hidden_size(config: JsonObject) -> int:
    """A vision model's pooled width: the last stage's (``hidden_sizes``, convolutional
    models) or ``hidden_size`` (ViT), else 768."""
    stages = config.get("hidden_sizes")
    if isinstance(stages, Sequence) and not isinstance(stages, str) and stages:
        return config_int(stages[-1])
    return config_int(config.get("hidden_size", DEFAULT_HIDDEN_SIZE))


def image_size(config: JsonObject) -> int:
    size = config.get("image_size", DEFAULT_IMAGE_SIZE)
    return config_int(size[0] if isinstance(size, list) else size)


def pooler_axes(config: JsonObject) -> list[str | int]:
    """The axes of a vision base model's ``pooler_output``."""
    hidden = vision_hidden_size(config)
    if architecture(_model_type(config)).pooled_spatial:
        return ["batch", hidden, 1, 1]
    return ["batch", hidden]
