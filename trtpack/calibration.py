"""INT8 calibration data: batches of model inputs ("feeds") from a text file, a ``.npz`` or,
only when neither is given, synthetic inputs (with a warning that accuracy is unknown).

A text file holds one sample a line (``text<TAB>pair`` for sentence pairs); samples are
tokenized with the model's tokenizer and *bucketed* to the profile shapes: each sample is
padded to the smallest profile sequence size (min/opt/max of any profile) that holds it, and
a bucket is cut into batches of that profile's opt batch size. A ``.npz`` holds one array per
model input, samples along the first axis (ModelOpt's own calibration format).

The samples are split three ways by a fixed seed, stratified by length (short, medium and
long inputs each spread over every split; a file without short inputs gets a warning):
*calibration* (the quantization ranges), *search* (what the fallback search judges its
candidates on, with a margin) and *held-out* (judged once, at the end: it gates the build).
Neither the ranges nor the search have seen the held-out samples.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from trtpack.errors import UserInputError
from trtpack.onnx_files import sha256_file
from trtpack.recipe import Recipe
from trtpack.shapes import BATCH_AXIS, ShapeProfile, TensorSpec

CalibrationSource = Literal["text", "npz", "synthetic"]
CALIBRATION_METHODS = ("max", "entropy", "percentile")
Feed = dict[str, np.ndarray]

MAX_HOLDOUT = 48
MAX_SEARCH = 24
MIN_SAMPLES_FOR_HOLDOUT = 10
# Token-count strata of the split: short (a few words, where INT8 error shows most in a
# mean-pooled embedding), medium, long.
SHORT_TOKENS = 8
MEDIUM_TOKENS = 24
STRATA = ("short", "medium", "long")
SYNTHETIC_SAMPLES = 32
TEXT_KINDS = {"token_ids": "input_ids", "attention_mask": "attention_mask",
              "token_type_ids": "token_type_ids"}

SYNTHETIC_WARNING = (
    "INT8 calibration used SYNTHETIC random inputs (no --calibration file and no "
    "precision_options.int8.calibration in the recipe): the quantization ranges do not come "
    "from real data, so the accuracy of the INT8 model on real inputs is UNKNOWN. Pass "
    "--calibration FILE (a text file with one sample a line, or a .npz of input arrays)."
)


@dataclass
class CalibrationData:
    """Calibration batches, held-out batches for the fallback search, and where they came from."""

    feeds: list[Feed]
    holdout: list[Feed]
    source: CalibrationSource
    path: Path | None = None
    samples: int = 0
    holdout_samples: int = 0
    warnings: list[str] = field(default_factory=list)
    search: list[Feed] = field(default_factory=list)
    search_samples: int = 0
    # the text of each row of each held-out / search batch (text calibration only)
    holdout_texts: list[list[str]] = field(default_factory=list)
    search_texts: list[list[str]] = field(default_factory=list)
    # samples per length stratum in each split, e.g. {"calibration": {"short": 4, ...}}
    strata: dict[str, dict[str, int]] = field(default_factory=dict)

    def describe(self) -> str:
        where = f" {self.path}" if self.path else ""
        return (f"{self.source}{where}: {self.samples} samples in {len(self.feeds)} batches, "
                f"{self.search_samples} for the search, {self.holdout_samples} held out")


def calibration_path(options: Any) -> Path | None:
    """``--calibration`` if given, else the recipe's ``precision_options.int8.calibration``."""
    if options.calibration is not None:
        return Path(options.calibration)
    configured = options.recipe.precision_options.int8.calibration
    return Path(configured) if configured else None


def file_sha256(path: Path) -> str:
    """sha256 of a calibration file; unreadable is the user's error (exit 2)."""
    try:
        return sha256_file(path)
    except OSError as e:
        raise UserInputError(f"cannot read calibration file {path}: {e.strerror}") from None


def _check_file(path: Path) -> None:
    if not path.exists():
        raise UserInputError(f"calibration file {path} does not exist")
    if not path.is_file():
        raise UserInputError(f"calibration path {path} is not a file")


def read_text_samples(path: Path) -> list[str]:
    """Non-blank lines of a UTF-8 text file, stripped; a file without any is a user error."""
    _check_file(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserInputError(
            f"calibration file {path} is not UTF-8 text (byte {e.start}); give a text file "
            "with one sample a line, or a .npz of input arrays"
        ) from None
    except OSError as e:
        raise UserInputError(f"cannot read calibration file {path}: {e.strerror}") from None
    samples = [line.strip() for line in text.splitlines()]
    samples = [s for s in samples if s and "\x00" not in s]
    if not samples:
        raise UserInputError(
            f"calibration file {path} has no usable samples: expected one text sample a line"
        )
    return samples


def _token_spec(recipe: Recipe) -> TensorSpec | None:
    return next((s for s in recipe.input_specs() if s.kind == "token_ids"), None)


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


def _chunks(items: list[Any], size: int, min_size: int) -> Iterable[list[Any]]:
    for start in range(0, len(items), size):
        chunk = items[start:start + size]
        while len(chunk) < min_size:  # a profile's min batch: repeat samples of the bucket
            chunk = chunk + items[: min_size - len(chunk)]
        yield chunk


def _text_inputs(recipe: Recipe) -> list[TensorSpec]:
    specs = recipe.input_specs()
    other = [s.name for s in specs if s.kind not in TEXT_KINDS]
    if other or _token_spec(recipe) is None:
        raise UserInputError(
            f"text calibration needs a text model, but inputs {other or [s.name for s in specs]}"
            " are not token ids / attention mask / token types; give a .npz of input arrays"
        )
    return specs


def text_feeds(texts: Sequence[str], tokenizer: Any, recipe: Recipe,
               profiles: Sequence[ShapeProfile]) -> list[Feed]:
    """Tokenize samples and pad each to the smallest profile sequence size that holds it."""
    return text_feeds_with_texts(texts, tokenizer, recipe, profiles)[0]


def text_feeds_with_texts(texts: Sequence[str], tokenizer: Any, recipe: Recipe,
                          profiles: Sequence[ShapeProfile]
                          ) -> tuple[list[Feed], list[list[str]]]:
    """``text_feeds`` and, for each batch, the text of each of its rows."""
    specs = _text_inputs(recipe)
    token_spec = _token_spec(recipe)
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
        for chunk in _chunks(by_bucket.get(bucket.seq, []), bucket.batch, bucket.min_batch):
            row_texts.append(["\t".join(p) for p in chunk])
            first = [p[0] for p in chunk]
            second = [p[1] if len(p) == 2 else "" for p in chunk] if with_pairs else None
            encoded = tokenizer(first, second, padding="max_length", truncation=True,
                                max_length=bucket.seq, return_tensors="np")
            feed: Feed = {}
            for spec in specs:
                value = encoded.get(TEXT_KINDS[spec.kind])
                if value is None:  # a tokenizer without token types
                    value = np.zeros_like(encoded["input_ids"])
                feed[spec.name] = np.asarray(value).astype(spec.dtype)
            feeds.append(feed)
    # The largest batch first: ModelOpt runs its shape probes on the first calibration batch.
    order = sorted(range(len(feeds)),
                   key=lambda i: -int(np.prod(next(iter(feeds[i].values())).shape)))
    return [feeds[i] for i in order], [row_texts[i] for i in order]


def tight_text_feeds(texts: Sequence[str], tokenizer: Any, recipe: Recipe,
                     profiles: Sequence[ShapeProfile]) -> tuple[list[Feed], list[list[str]]]:
    """Samples sorted by length in batches of the first profile's opt batch size, each
    batch padded only to its longest sample (at least the smallest profile sequence):
    the cheapest inputs to judge samples one by one on (the search and held-out splits;
    the profile corners are judged separately at their exact shapes)."""
    specs = _text_inputs(recipe)
    token_spec = _token_spec(recipe)
    assert token_spec is not None
    buckets = sequence_buckets(token_spec, profiles)
    shortest, longest = buckets[0].seq, buckets[-1].seq
    size = max(1, buckets[0].batch)
    pairs = [t.split("\t", 1) if "\t" in t else [t] for t in texts]
    with_pairs = any(len(p) == 2 for p in pairs) and any(
        s.kind == "token_type_ids" for s in specs)
    lengths = token_counts(texts, tokenizer, longest)
    order = sorted(range(len(pairs)), key=lambda i: lengths[i])
    feeds: list[Feed] = []
    row_texts: list[list[str]] = []
    for chunk_rows in _chunks(order, size, buckets[0].min_batch):
        chunk = [pairs[i] for i in chunk_rows]
        seq = min(longest, max(shortest, max(lengths[i] for i in chunk_rows)))
        first = [p[0] for p in chunk]
        second = [p[1] if len(p) == 2 else "" for p in chunk] if with_pairs else None
        encoded = tokenizer(first, second, padding="max_length", truncation=True,
                            max_length=seq, return_tensors="np")
        feed: Feed = {}
        for spec in specs:
            value = encoded.get(TEXT_KINDS[spec.kind])
            if value is None:
                value = np.zeros_like(encoded["input_ids"])
            feed[spec.name] = np.asarray(value).astype(spec.dtype)
        feeds.append(feed)
        row_texts.append(["\t".join(p) for p in chunk])
    return feeds, row_texts


def token_counts(texts: Sequence[str], tokenizer: Any, longest: int) -> list[int]:
    """Tokens of each sample (special tokens included, at most ``longest``)."""
    pairs = [t.split("\t", 1) for t in texts]
    return [len(tokenizer(p[0], p[1] if len(p) == 2 else None, truncation=True,
                          max_length=longest)["input_ids"]) for p in pairs]


def stratum(tokens: int) -> str:
    return "short" if tokens <= SHORT_TOKENS else (
        "medium" if tokens <= MEDIUM_TOKENS else "long")


@dataclass(frozen=True)
class Splits:
    """Row indices of each split."""

    calibration: list[int]
    search: list[int]
    holdout: list[int]


def split_three(lengths: Sequence[int], max_samples: int, seed: int) -> Splits:
    """Calibration / search / held-out rows, stratified by length: within each stratum
    (short / medium / long, see ``stratum``), after a shuffle with ``seed``, the rows go
    held-out, search, calibration, calibration, calibration in turn, so every stratum with
    at least three samples is in every split. The search and held-out splits are capped
    (``MAX_SEARCH``, ``MAX_HOLDOUT``); under ``MIN_SAMPLES_FOR_HOLDOUT`` samples everything
    calibrates."""
    n = len(lengths)
    if n < MIN_SAMPLES_FOR_HOLDOUT:
        return Splits(list(range(n))[:max_samples], [], [])
    rng = np.random.default_rng(seed)
    calibration: list[int] = []
    search: list[int] = []
    holdout: list[int] = []
    cycle = (holdout, search, calibration, calibration, calibration)
    for name in STRATA:
        rows = [i for i, t in enumerate(lengths) if stratum(t) == name]
        for k, i in enumerate(rng.permutation(rows).tolist() if rows else []):
            cycle[k % len(cycle)].append(int(i))
    # caps: overflow of the held-out and search splits goes to calibration
    holdout_keep = _spread(holdout, MAX_HOLDOUT)
    search_keep = _spread(search, MAX_SEARCH)
    calibration += [i for i in holdout + search if i not in holdout_keep
                    and i not in search_keep]
    return Splits(sorted(calibration)[:max_samples] if len(calibration) <= max_samples
                  else sorted(rng.permutation(calibration)[:max_samples].tolist()),
                  sorted(search_keep), sorted(holdout_keep))


def _spread(rows: list[int], cap: int) -> list[int]:
    """At most ``cap`` of ``rows`` (already stratified and shuffled), evenly taken."""
    if len(rows) <= cap:
        return list(rows)
    step = len(rows) / cap
    return [rows[int(k * step)] for k in range(cap)]


def strata_counts(lengths: Sequence[int], splits: Splits) -> dict[str, dict[str, int]]:
    found: dict[str, dict[str, int]] = {}
    for split, rows in (("calibration", splits.calibration), ("search", splits.search),
                        ("holdout", splits.holdout)):
        found[split] = {name: sum(stratum(lengths[i]) == name for i in rows)
                        for name in STRATA}
    return found


def strata_warnings(path: Path, lengths: Sequence[int]) -> list[str]:
    present = {stratum(t) for t in lengths}
    missing = [s for s in STRATA if s not in present]
    if not missing:
        return []
    bounds = {"short": f"<= {SHORT_TOKENS} tokens",
              "medium": f"{SHORT_TOKENS + 1}-{MEDIUM_TOKENS} tokens",
              "long": f"> {MEDIUM_TOKENS} tokens"}
    return [f"calibration file {path} has no {s} inputs ({bounds[s]}): INT8 accuracy on "
            f"such inputs is not measured by the held-out gate" for s in missing]


def read_npz_samples(path: Path, recipe: Recipe) -> tuple[dict[str, np.ndarray], list[str]]:
    """One array per model input with samples along axis 0, validated against the recipe."""
    _check_file(path)
    warnings: list[str] = []
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError) as e:
        raise UserInputError(f"calibration file {path} is not a readable .npz: {e}") from None
    specs = recipe.input_specs()
    missing = [s.name for s in specs if s.name not in arrays]
    if missing:
        raise UserInputError(
            f"calibration file {path} has no array for input(s) {missing}; it has "
            f"{sorted(arrays) or 'no arrays'} (one array per model input, samples along axis 0)"
        )
    extra = sorted(set(arrays) - {s.name for s in specs})
    if extra:
        warnings.append(f"calibration file {path}: ignored arrays {extra} (not model inputs)")
    counts = {s.name: (arrays[s.name].shape[0] if arrays[s.name].ndim else 0) for s in specs}
    if len(set(counts.values())) != 1:
        raise UserInputError(
            f"calibration file {path}: inputs have different sample counts {counts}")
    n = next(iter(counts.values()))
    if n == 0:
        raise UserInputError(f"calibration file {path} has no usable samples (0 rows)")
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        a = arrays[spec.name]
        if a.ndim != spec.rank:
            raise UserInputError(
                f"calibration file {path}: '{spec.name}' has shape {list(a.shape)}, the model "
                f"input has rank {spec.rank} ({', '.join(map(str, spec.axes))})")
        for d, axis in enumerate(spec.axes):
            if isinstance(axis, int) and a.shape[d] != axis:
                raise UserInputError(
                    f"calibration file {path}: '{spec.name}' dimension {d} is {a.shape[d]}, "
                    f"the model needs {axis}")
        if not np.issubdtype(a.dtype, np.number) and a.dtype != np.bool_:
            raise UserInputError(
                f"calibration file {path}: '{spec.name}' has non-numeric dtype {a.dtype}")
        if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
            raise UserInputError(
                f"calibration file {path}: '{spec.name}' holds NaN or infinite values")
        want = np.dtype(spec.dtype)
        if np.issubdtype(want, np.integer) and not (
                np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_):
            raise UserInputError(
                f"calibration file {path}: '{spec.name}' has dtype {a.dtype}, the model "
                f"input is {want} (integer token ids / masks)")
        out[spec.name] = a.astype(spec.dtype)
    return out, warnings


def npz_feeds(arrays: Mapping[str, np.ndarray], rows: Sequence[int], recipe: Recipe,
              profiles: Sequence[ShapeProfile]) -> list[Feed]:
    """Cut the selected rows into batches of the first profile's opt batch size."""
    specs = recipe.input_specs()
    batched = specs[0].has_dynamic_batch
    r = profiles[0].shapes[specs[0].name] if profiles else None
    size = (r.opt[0] if r is not None else 1) if batched else 1
    min_size = (r.min[0] if r is not None else 1) if batched else 1
    idx = list(rows)
    feeds: list[Feed] = []
    for chunk in _chunks(idx, max(1, size), min_size):
        feeds.append({s.name: np.ascontiguousarray(arrays[s.name][chunk]) for s in specs})
    return feeds


def synthetic_feeds(recipe: Recipe, profiles: Sequence[ShapeProfile], samples: int,
                    seed: int, vocab_size: int | None = None) -> list[Feed]:
    """Random in-vocabulary inputs at every profile corner, cycled until ``samples`` rows."""
    from trtpack.samples import make_inputs

    vocab = vocab_size or int(recipe.config.get("vocab_size", 30522))
    specs = recipe.input_specs()
    corners = [shapes for p in profiles for _, shapes in p.corners()]
    feeds: list[Feed] = []
    total = 0
    i = 0
    while total < samples:
        shapes = corners[i % len(corners)]
        feed = make_inputs(specs, shapes, tokenizer=None, vocab_size=vocab, seed=seed + 7919 * i)
        feeds.append(feed)
        total += next(iter(feed.values())).shape[0] if feed else 1
        i += 1
    return feeds


def feed_rows(feeds: Sequence[Feed]) -> int:
    return sum(next(iter(f.values())).shape[0] for f in feeds if f)


def split_holdout(n: int, max_samples: int, seed: int) -> tuple[list[int], list[int]]:
    """(calibration rows, held-out rows) of ``n`` samples, shuffled with ``seed``."""
    order = np.random.default_rng(seed).permutation(n).tolist()
    held = min(MAX_HOLDOUT, n // 5) if n >= MIN_SAMPLES_FOR_HOLDOUT else 0
    return sorted(order[held:][:max_samples]), sorted(order[:held])


def load_tokenizer(folder: Path) -> Any:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def check_calibration_input(path: Path, recipe: Recipe, profiles: Sequence[ShapeProfile]
                            ) -> None:
    """What can be checked of a calibration file before any stage runs (exit 2 when bad):
    a .npz must hold every input with the model's rank and a compatible dtype; a text file
    needs a sample that fits the largest profile (checked without the tokenizer: a line of
    more words than the largest sequence can never fit)."""
    if path.suffix.lower() == ".npz":
        read_npz_samples(path, recipe)
        return
    texts = read_text_samples(path)
    token_spec = _token_spec(recipe)
    if token_spec is None:
        return
    longest = sequence_buckets(token_spec, profiles)[-1].seq
    if all(len(t.split()) > longest for t in texts):
        raise UserInputError(
            f"calibration file {path}: every line is longer than the largest profile takes "
            f"({longest} tokens); expected one sample a line that fits the profiles")


def npz_lengths(arrays: Mapping[str, np.ndarray], recipe: Recipe) -> list[int]:
    """Unpadded length of each .npz sample (its attention-mask sum), for the strata."""
    mask = next((s.name for s in recipe.input_specs() if s.kind == "attention_mask"), None)
    n = next(iter(arrays.values())).shape[0]
    if mask is None or arrays[mask].ndim != 2:
        return [MEDIUM_TOKENS] * n
    return [int(v) for v in (arrays[mask] != 0).sum(axis=1)]


def load_calibration(recipe: Recipe, profiles: Sequence[ShapeProfile], path: Path | None, *,
                     tokenizer: Any, max_samples: int, seed: int) -> CalibrationData:
    """Calibration, search and held-out batches from ``path`` (text, tokenized with
    ``tokenizer``, or .npz), or synthetic ones."""
    if max_samples < 1:
        raise UserInputError("precision_options.int8.max_calibration_samples must be >= 1")
    if path is None:
        feeds = synthetic_feeds(recipe, profiles, min(max_samples, SYNTHETIC_SAMPLES), seed)
        holdout = synthetic_feeds(recipe, profiles, 4, seed + 1_000_003)
        search = synthetic_feeds(recipe, profiles, 4, seed + 2_000_003)
        return CalibrationData(feeds, holdout, "synthetic", None, feed_rows(feeds),
                               feed_rows(holdout), [SYNTHETIC_WARNING], search,
                               feed_rows(search))
    if path.suffix.lower() == ".npz":
        arrays, warnings = read_npz_samples(path, recipe)
        lengths = npz_lengths(arrays, recipe)
        splits = split_three(lengths, max_samples, seed)
        return CalibrationData(
            npz_feeds(arrays, splits.calibration, recipe, profiles),
            npz_feeds(arrays, splits.holdout, recipe, profiles) if splits.holdout else [],
            "npz", path, len(splits.calibration), len(splits.holdout), warnings,
            npz_feeds(arrays, splits.search, recipe, profiles) if splits.search else [],
            len(splits.search), strata=strata_counts(lengths, splits))
    texts = read_text_samples(path)
    _text_inputs(recipe)
    if tokenizer is None:
        raise UserInputError(
            f"calibration file {path} is text, but recipe '{recipe.name}' has no tokenizer to "
            "tokenize it with; give a .npz of input arrays instead"
        )
    token_spec = _token_spec(recipe)
    assert token_spec is not None
    longest = sequence_buckets(token_spec, profiles)[-1].seq
    lengths = token_counts(texts, tokenizer, longest + 1)
    fits = [i for i, n in enumerate(lengths) if n <= longest]
    if not fits:
        raise UserInputError(
            f"calibration file {path}: every sample is longer than the largest profile takes "
            f"({longest} tokens); expected one sample a line that fits the profiles")
    warnings = strata_warnings(path, lengths)
    if len(fits) < len(texts):
        warnings.append(f"calibration file {path}: {len(texts) - len(fits)} samples longer "
                        f"than the largest profile ({longest} tokens) are truncated")
    splits = split_three(lengths, max_samples, seed)
    feeds = text_feeds([texts[i] for i in splits.calibration], tokenizer, recipe, profiles)
    holdout, holdout_texts = tight_text_feeds(
        [texts[i] for i in splits.holdout], tokenizer, recipe, profiles) \
        if splits.holdout else ([], [])
    search, search_texts = tight_text_feeds(
        [texts[i] for i in splits.search], tokenizer, recipe, profiles) \
        if splits.search else ([], [])
    return CalibrationData(feeds, holdout, "text", path, len(splits.calibration),
                           len(splits.holdout), warnings, search, len(splits.search),
                           holdout_texts, search_texts, strata_counts(lengths, splits))


def save_feeds(path: Path, feeds: Sequence[Feed]) -> None:
    """Batches of different shapes in one .npz (``<index>/<input name>``)."""
    arrays = {f"{i:06d}/{name}": value for i, feed in enumerate(feeds)
              for name, value in feed.items()}
    with open(path, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]


def load_feeds(path: Path) -> list[Feed]:
    feeds: dict[str, Feed] = {}
    with np.load(path, allow_pickle=False) as data:
        for key in data.files:
            index, name = key.split("/", 1)
            feeds.setdefault(index, {})[name] = data[key]
    return [feeds[k] for k in sorted(feeds)]
