"""Text calibration samples tokenized into model inputs ("feeds").

Each sample is padded to the smallest profile sequence size (min/opt/max of any profile)
that holds it (*bucketed*), and a bucket is cut into batches of that profile's opt batch
size; the search, check and held-out splits are batched tightly instead (sorted by length,
each batch padded only to its longest sample: ``tight_floor``). A line ``text<TAB>pair`` is
a sentence pair.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from trtpack.errors import UserInputError
from trtpack.shapes import BATCH_AXIS, ShapeProfile, TensorSpec
from trtpack.sources.recipe import TOKENIZER_OUTPUTS, Recipe

if TYPE_CHECKING:
    from trtpack.verify.samples import TokenIds, Tokenizer

Item = TypeVar("Item")

Feed = dict[str, np.ndarray]




def token_ids_spec(recipe: Recipe) -> TensorSpec | None:
    name = recipe.input_name("token_ids")
    return next((s for s in recipe.input_specs() if s.name == name), None)


def _seq_index(spec: TensorSpec) -> int:
    """The sequence dimension: the last dimension that is not the batch axis."""
    return max(i for i, a in enumerate(spec.axes) if not (i == 0 and a == BATCH_AXIS))


@dataclass(frozen=True)
class Bucket:
    seq: int
    batch: int
    min_batch: int


def sequence_buckets(spec: TensorSpec, profiles: Sequence[ShapeProfile]) -> list[Bucket]:
    """One bucket per distinct sequence size of any profile corner, smallest first."""
    seq_i = _seq_index(spec)
    buckets: dict[int, Bucket] = {}
    for profile in profiles:
        r = profile.shapes[spec.name]
        batched = spec.has_dynamic_batch
        lo_b, opt_b = (r.min[0], r.opt[0]) if batched else (1, 1)
        for corner in (r.min, r.opt, r.max):
            buckets.setdefault(corner[seq_i], Bucket(corner[seq_i], opt_b, lo_b))
    return [buckets[s] for s in sorted(buckets)]


def chunks(items: list[Item], size: int, min_size: int) -> Iterable[list[Item]]:
    for start in range(0, len(items), size):
        chunk = items[start:start + size]
        while len(chunk) < min_size:  # a profile's min batch: repeat samples of the bucket
            chunk = chunk + items[: min_size - len(chunk)]
        yield chunk


def text_inputs(recipe: Recipe) -> list[TensorSpec]:
    specs = recipe.input_specs()
    other = [s.name for s in specs if s.kind not in TOKENIZER_OUTPUTS]
    if other or token_ids_spec(recipe) is None:
        raise UserInputError(
            f"text calibration needs a text model, but inputs {other or [s.name for s in specs]}"
            " are not token ids / attention mask / token types; give a .npz of input arrays"
        )
    return specs


def encode_batch(tokenizer: Tokenizer, chunk: Sequence[Sequence[str]], seq: int,
                 specs: Sequence[TensorSpec], with_pairs: bool) -> Feed:
    """One batch of samples (each ``[text]`` or ``[text, pair]``) padded to ``seq`` tokens,
    one array per model input."""
    first = [p[0] for p in chunk]
    second = [p[1] if len(p) == 2 else "" for p in chunk] if with_pairs else None
    encoded = tokenizer(first, second, padding="max_length", truncation=True,
                        max_length=seq, return_tensors="np")
    feed: Feed = {}
    for spec in specs:
        value = encoded.get(TOKENIZER_OUTPUTS[spec.kind])
        if value is None:  # a tokenizer without token types
            value = np.zeros_like(encoded["input_ids"])
        feed[spec.name] = np.asarray(value).astype(spec.dtype)
    return feed


def text_feeds(texts: Sequence[str], tokenizer: Tokenizer, recipe: Recipe,
               profiles: Sequence[ShapeProfile]) -> list[Feed]:
    """Tokenize samples and pad each to the smallest profile sequence size that holds it."""
    return text_feeds_with_texts(texts, tokenizer, recipe, profiles)[0]


def text_feeds_with_texts(texts: Sequence[str], tokenizer: Tokenizer, recipe: Recipe,
                          profiles: Sequence[ShapeProfile]
                          ) -> tuple[list[Feed], list[list[str]]]:
    """``text_feeds`` and, for each batch, the text of each of its rows."""
    specs = text_inputs(recipe)
    token_spec = token_ids_spec(recipe)
    assert token_spec is not None
    buckets = sequence_buckets(token_spec, profiles)
    longest = buckets[-1].seq
    pairs = [t.split("\t", 1) if "\t" in t else [t] for t in texts]
    with_pairs = any(len(p) == 2 for p in pairs) and any(
        s.kind == "token_type_ids" for s in specs)
    lengths = [
        len(tokenizer(p[0], p[1] if with_pairs and len(p) == 2 else None, truncation=True,
                      max_length=longest)["input_ids"])
        for p in pairs
    ]
    by_bucket: dict[int, list[list[str]]] = {}
    for p, n in zip(pairs, lengths, strict=True):
        bucket = next(b for b in buckets if b.seq >= n or b.seq == longest)
        by_bucket.setdefault(bucket.seq, []).append(p)
    feeds: list[Feed] = []
    row_texts: list[list[str]] = []
    for bucket in buckets:
        for chunk in chunks(by_bucket.get(bucket.seq, []), bucket.batch, bucket.min_batch):
            row_texts.append(["\t".join(p) for p in chunk])
            feeds.append(encode_batch(tokenizer, chunk, bucket.seq, specs, with_pairs))
    # The largest batch first: ModelOpt runs its shape probes on the first calibration batch.
    order = sorted(range(len(feeds)),
                   key=lambda i: -int(np.prod(next(iter(feeds[i].values())).shape)))
    return [feeds[i] for i in order], [row_texts[i] for i in order]


def tight_text_feeds(texts: Sequence[str], tokenizer: Tokenizer, recipe: Recipe,
                     profiles: Sequence[ShapeProfile]) -> tuple[list[Feed], list[list[str]]]:
    """Samples sorted by length in batches of the first profile's opt batch size, each
    batch padded only to its longest sample: the cheapest inputs to judge samples one by
    one on in ONNX Runtime (the search, check and held-out splits; the profile corners are
    judged separately at their exact shapes). ``tight_floor`` says how short a batch may be.
    """
    specs = text_inputs(recipe)
    token_spec = token_ids_spec(recipe)
    assert token_spec is not None
    buckets = sequence_buckets(token_spec, profiles)
    longest = buckets[-1].seq
    shortest = tight_floor(token_spec, buckets[0].seq, tokenizer)
    size = max(1, buckets[0].batch)
    pairs = [t.split("\t", 1) if "\t" in t else [t] for t in texts]
    with_pairs = any(len(p) == 2 for p in pairs) and any(
        s.kind == "token_type_ids" for s in specs)
    lengths = token_counts(texts, tokenizer, longest)
    order = sorted(range(len(pairs)), key=lambda i: lengths[i])
    feeds: list[Feed] = []
    row_texts: list[list[str]] = []
    for chunk_rows in chunks(order, size, buckets[0].min_batch):
        chunk = [pairs[i] for i in chunk_rows]
        seq = min(longest, max(shortest, max(lengths[i] for i in chunk_rows)))
        feeds.append(encode_batch(tokenizer, chunk, seq, specs, with_pairs))
        row_texts.append(["\t".join(p) for p in chunk])
    return feeds, row_texts


def tight_floor(token_spec: TensorSpec, smallest_profile_seq: int, tokenizer: Tokenizer
                ) -> int:
    """The shortest sequence a tight batch is padded to: 1 where the sequence axis is dynamic
    and padding goes on the right, else the smallest profile sequence.

    With right padding, a real token's outputs do not depend on how many padding tokens
    follow it (the attention mask gives them zero weight; positions are unchanged), so
    padding a 5-token sample to a 128-token profile minimum only multiplies the work of
    every ONNX Runtime run of it (bert-large's design card: the held-out, check, search and
    prefix batches, 9 of the 17 the precision stage's reference run computes, most of their
    samples a few words long). A left-padded model's positions move with the padding, and a
    static sequence axis takes one size only: both keep the profile's."""
    axis = token_spec.axes[_seq_index(token_spec)]
    right = getattr(tokenizer, "padding_side", "right") == "right"
    return 1 if isinstance(axis, str) and right else smallest_profile_seq


def token_counts(texts: Sequence[str], tokenizer: Tokenizer, longest: int) -> list[int]:
    """Tokens of each sample (special tokens included, at most ``longest``)."""
    pairs = [t.split("\t", 1) for t in texts]
    return [len(tokenizer(p[0], p[1] if len(p) == 2 else None, truncation=True,
                          max_length=longest)["input_ids"]) for p in pairs]


class JsonTokenizer:
    """A saved ``tokenizer.json`` read with ``tokenizers`` alone, called as a transformers
    tokenizer is called here (one text or a list, an optional pair, ``padding="max_length"``,
    ``truncation``, ``max_length``, ``return_tensors="np"``): calibration without importing
    transformers (and torch), seconds of a CPU INT8 build. ``token_text`` decodes with it."""

    padding_side = "right"  # json_tokenizer reads no other

    def __init__(self, path: Path, pad_token: str) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(path))
        self.pad_token = pad_token
        self.pad_id = self.tokenizer.token_to_id(pad_token)

    def __call__(self, text: str | Sequence[str], text_pair: str | Sequence[str] | None = None,
                 padding: bool | str = False,
                 truncation: bool = False, max_length: int | None = None,
                 return_tensors: str | None = None) -> dict[str, TokenIds]:
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        # transformers reads an empty pair of a single text as no pair (not in a batch)
        pairs = None if text_pair is None or (single and not text_pair) \
            else [text_pair] if single else list(text_pair)
        tok = self.tokenizer
        if truncation and max_length:
            tok.enable_truncation(max_length)
        else:
            tok.no_truncation()
        if padding == "max_length" and max_length:
            tok.enable_padding(length=max_length, pad_id=self.pad_id, pad_token=self.pad_token)
        else:
            tok.no_padding()
        encoded = tok.encode_batch(list(zip(texts, pairs, strict=True)) if pairs else texts)
        found: dict[str, list[list[int]]] = {
            "input_ids": [e.ids for e in encoded],
            "attention_mask": [e.attention_mask for e in encoded],
            "token_type_ids": [e.type_ids for e in encoded]}
        if return_tensors == "np":
            return {k: np.asarray(v, dtype=np.int64) for k, v in found.items()}
        if single:
            return {k: v[0] for k, v in found.items()}
        return {k: v for k, v in found.items()}

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))


def saved_tokenizer(recipe: Recipe, folder: Path) -> Tokenizer | None:
    """The tokenizer a build saved in ``folder`` (the export's ``tokenizer/``), read once for
    calibration, splits and sample text: tokenizers alone where the saved tokenizer allows (no
    transformers import), else transformers'."""
    from trtpack.pytorch.models import load_tokenizer

    tokenizer = json_tokenizer(folder) if recipe.tokenizer else None
    return tokenizer or load_tokenizer(recipe, folder)


def json_tokenizer(folder: Path | None) -> JsonTokenizer | None:
    """The tokenizer saved in ``folder`` as a ``JsonTokenizer``, or None where it needs
    transformers (no tokenizer.json, no pad token in tokenizer_config.json, left padding)."""
    import json

    if folder is None:
        return None
    folder = Path(folder)
    config_path = folder / "tokenizer_config.json"
    if not (folder / "tokenizer.json").is_file() or not config_path.is_file():
        return None
    config = json.loads(config_path.read_text(encoding="utf-8"))
    pad = config.get("pad_token")
    pad = pad.get("content") if isinstance(pad, dict) else pad
    if not isinstance(pad, str) or config.get("padding_side", "right") != "right" \
            or config.get("truncation_side", "right") != "right":
        return None
    tokenizer = JsonTokenizer(folder / "tokenizer.json", pad)
    return tokenizer if tokenizer.pad_id is not None else None
