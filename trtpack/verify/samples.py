"""Realistic model inputs for a shape: real tokenized text where there is a tokenizer,
otherwise in-vocabulary token ids with padded attention masks; images with image-like
statistics. Never all zeros or all ones: verification on such inputs proves little."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from trtpack.shapes import Shape, TensorSpec
from trtpack.sources.inputs import INTEGER_DTYPES, ValueRule
from trtpack.sources.recipe import TOKENIZER_OUTPUTS

# What a tokenizer gives for each of its outputs: an array with ``return_tensors="np"``,
# else the ids of one text (or of each text of a batch).
TokenIds = np.ndarray | list[int] | list[list[int]]


class TokenDecoder(Protocol):
    """A tokenizer as a report reads it: token ids back to text (``tokenizers.Tokenizer``,
    a transformers tokenizer, ``JsonTokenizer``)."""

    def decode(self, ids: list[int], /, skip_special_tokens: bool = ...) -> str | list[str]: ...


class Tokenizer(TokenDecoder, Protocol):
    """A tokenizer as trtpack calls it to make inputs: as transformers' tokenizers are
    called (one text or a batch, an optional pair, padding, truncation), or a
    ``trtpack.precision.calibration.text_batches.JsonTokenizer``."""

    def __call__(self, text: str | Sequence[str],
                 text_pair: str | Sequence[str] | None = ..., *,
                 padding: bool | str = ..., truncation: bool = ...,
                 max_length: int | None = ..., return_tensors: str | None = ...
                 ) -> Mapping[str, TokenIds]: ...

GENERATED_INTEGERS = (0, 100)
"""[low, high) of a generic integer input that has no value rule."""

SENTENCES: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "Triton Inference Server runs TensorRT engines, ONNX models and Python code side by side.",
    "How do I reset my password if I no longer have access to my email account?",
    "The central bank left interest rates unchanged, citing persistent inflation in services.",
    "She played the cello every evening after dinner.",
    "Dynamic batching groups requests that arrive within a short window into one batch.",
    "A storm knocked out power to thousands of homes along the coast on Tuesday night.",
    "Is it safe to take ibuprofen together with a course of antibiotics?",
    "Our quarterly revenue grew twelve percent, driven mostly by subscriptions in Europe.",
    "The museum's new wing displays ceramics from the Song and Ming dynasties.",
    "Please deliver the package to the side door; the front gate is locked.",
    "Mixed precision keeps layer normalization and softmax in float32 to avoid overflow.",
    "He missed the last train and walked home through the quiet streets.",
    "What are the opening hours of the public library on weekends?",
    "Researchers found that the enzyme binds more tightly at lower temperatures.",
    "The referee's late decision sparked protests from the home crowd.",
    "Mount the volume read-only and restart the container to apply the configuration.",
    "Fresh basil, ripe tomatoes and a little olive oil make a perfect summer salad.",
    "Without a valid visa, travellers may be refused boarding at the airport.",
    "The novel follows three generations of a family of fishermen in northern Norway.",
    "Latency rose sharply when the queue filled up during the evening peak.",
    "Can you recommend a good beginner's book on linear algebra?",
    "The committee postponed the vote until the budget figures had been audited.",
    "Small kittens sleep for most of the day and play at night.",
)

TEXT_PAIRS: tuple[str, ...] = (
    "What does the author conclude?",
    "Where did this happen?",
    "Is this statement positive or negative?",
    "Summarize the sentence in a few words.",
)


def _text_batch(tokenizer: Tokenizer, batch: int, seq: int, with_pairs: bool, offset: int
                ) -> dict[str, np.ndarray]:
    texts = [SENTENCES[(offset + i) % len(SENTENCES)] for i in range(batch)]
    # Vary the lengths so a batch mixes padded and full rows.
    texts = [t if i % 3 != 2 else " ".join([t] * 4) for i, t in enumerate(texts)]
    pairs = [TEXT_PAIRS[i % len(TEXT_PAIRS)] if (with_pairs and i % 2) else None
             for i in range(batch)]
    if any(pairs):
        encoded = tokenizer(texts, [p or "" for p in pairs], padding="max_length",
                            truncation=True, max_length=seq, return_tensors="np")
    else:
        encoded = tokenizer(texts, padding="max_length", truncation=True, max_length=seq,
                            return_tensors="np")
    return {k: np.asarray(v) for k, v in encoded.items()}


def _synthetic_tokens(rng: np.random.Generator, batch: int, seq: int, vocab: int
                      ) -> dict[str, np.ndarray]:
    low = min(1000, vocab // 4)
    ids = rng.integers(low, vocab, size=(batch, seq), dtype=np.int64)
    lengths = rng.integers(max(1, seq // 3), seq + 1, size=batch)
    lengths[0] = seq  # at least one full row
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    ids = np.where(mask == 1, ids, 0)
    token_types = np.zeros((batch, seq), dtype=np.int64)
    for row, length in enumerate(lengths):
        if row % 2 and length > 2:
            token_types[row, length // 2 : length] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": token_types}


def _image(rng: np.random.Generator, shape: Shape) -> np.ndarray:
    """Smooth, normalized, image-like noise (ImageNet mean/std scale)."""
    coarse = rng.standard_normal((*shape[:-2], max(1, shape[-2] // 16), max(1, shape[-1] // 16)))
    reps = (1,) * (len(shape) - 2) + (16, 16)
    img = np.kron(coarse, np.ones(reps))[..., : shape[-2], : shape[-1]]
    img = img + 0.3 * rng.standard_normal(img.shape)
    out = np.zeros(shape, dtype=np.float32)
    out[..., : img.shape[-2], : img.shape[-1]] = img
    return out


def make_inputs(
    specs: Sequence[TensorSpec],
    shapes: Mapping[str, Shape],
    *,
    tokenizer: Tokenizer | None = None,
    vocab_size: int = 30522,
    seed: int = 0,
    offset: int = 0,
    values: Mapping[str, ValueRule] | None = None,
) -> dict[str, np.ndarray]:
    """Inputs for one case: ``shapes`` maps input names to concrete shapes; an input with a
    value rule (``values``: a recipe's ``value_rules()``) takes its constant or is drawn
    from its range, the others are made from their kind."""
    rng = np.random.default_rng(seed)
    text: dict[str, np.ndarray] | None = None
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = tuple(shapes[spec.name])
        rule = (values or {}).get(spec.name)
        if rule is not None:
            feeds[spec.name] = ruled_values(rule, spec.dtype, shape, rng)
        elif spec.kind in TOKENIZER_OUTPUTS:
            if text is None or text["input_ids"].shape != shape:
                batch, seq = shape[0], shape[-1]
                with_pairs = any(s.kind == "token_type_ids" for s in specs)
                text = (_text_batch(tokenizer, batch, seq, with_pairs, offset)
                        if tokenizer is not None else
                        _synthetic_tokens(rng, batch, seq, vocab_size))
            value = text.get(TOKENIZER_OUTPUTS[spec.kind])
            if value is None:  # tokenizer without token types
                value = np.zeros(shape, dtype=np.int64)
            feeds[spec.name] = value.reshape(shape).astype(spec.dtype)
        elif spec.kind == "image":
            feeds[spec.name] = _image(rng, shape).astype(spec.dtype)
        elif np.issubdtype(np.dtype(spec.dtype), np.integer):
            feeds[spec.name] = rng.integers(*GENERATED_INTEGERS, size=shape).astype(spec.dtype)
        else:
            feeds[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
    return feeds


def ruled_values(rule: ValueRule, dtype: str, shape: Shape, rng: np.random.Generator
                 ) -> np.ndarray:
    """An input's values under its rule: the constant everywhere, or uniform in the range
    (whole numbers, both ends included, for an integer dtype)."""
    if rule.constant is not None:
        return np.full(shape, rule.constant, dtype=dtype)
    assert rule.low is not None and rule.high is not None
    if dtype in INTEGER_DTYPES:
        return rng.integers(int(rule.low), int(rule.high), size=shape, endpoint=True
                            ).astype(dtype)
    return rng.uniform(float(rule.low), float(rule.high), size=shape).astype(dtype)


def fed_values_text(inputs: Mapping[str, np.ndarray], rules: Mapping[str, ValueRule],
                    limit: int = 4) -> str:
    """What a case fed its small inputs and how they were chosen, for an error message:
    ``sr = 37 (drawn from [0, 100))``, ``sr = 16000 (--input)``; only inputs of at most
    ``limit`` elements, with the shapes of the others."""
    parts = []
    for name, value in inputs.items():
        if value.size > limit:
            parts.append(f"{name}: {'x'.join(map(str, value.shape))}")
            continue
        shown = value.item() if value.size == 1 else value.tolist()
        rule = rules.get(name)
        how = (f"from the rule {rule}" if rule is not None else
               f"drawn from [{GENERATED_INTEGERS[0]}, {GENERATED_INTEGERS[1]})"
               if np.issubdtype(value.dtype, np.integer) else "generated")
        parts.append(f"'{name}' = {shown} ({how})")
    return ", ".join(parts)
