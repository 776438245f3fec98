"""INT8 calibration data: batches of model inputs ("feeds") from a text file, a ``.npz`` or,
only when neither is given, synthetic inputs (with a warning that accuracy is unknown).

A text file holds one sample a line (``trtpack.precision.calibration.text_batches`` tokenizes and
batches it); a ``.npz`` holds one array per model input, samples along the first axis
(ModelOpt's own calibration format). The samples are split three ways
(``trtpack.precision.calibration.splits``): calibration, search and held-out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from trtpack.errors import UserInputError
from trtpack.precision.calibration.files import (
    npz_feeds,
    npz_lengths,
    read_npz_samples,
    read_text_samples,
)
from trtpack.precision.calibration.splits import (
    SHORT_TOKENS,
    split_three,
    strata_counts,
    strata_warnings,
    stratum,
)
from trtpack.precision.calibration.text_batches import (
    Feed,
    sequence_buckets,
    text_feeds,
    text_inputs,
    tight_text_feeds,
    token_counts,
    token_ids_spec,
)
from trtpack.shapes import ShapeProfile
from trtpack.sources import architectures
from trtpack.sources.recipe import Recipe

if TYPE_CHECKING:
    from trtpack.options import BuildPlan
    from trtpack.verify.samples import Tokenizer
from trtpack.verify.sample_files import check_token_ids

CalibrationSource = Literal["text", "default text", "npz", "synthetic"]

# Real text shipped inside the package (written for trtpack: chat and 1-4 word replies,
# questions, news, reviews, technical prose, long passages): what a text model with a
# tokenizer calibrates, searches and is gated on when no calibration file is given.
DEFAULT_TEXT = Path(__file__).resolve().parents[2] / "data" / "calibration-text.txt"

SYNTHETIC_SAMPLES = 32

SYNTHETIC_WARNING = (
    "INT8 calibration used SYNTHETIC random inputs (no --calibration file, no "
    "precision_options.int8.calibration in the recipe and no tokenizer for trtpack's "
    "default text): the quantization ranges do not come "
    "from real data, so the accuracy of the INT8 model on real inputs is UNKNOWN. Pass "
    "--calibration FILE (a text file with one sample a line, or a .npz of input arrays)."
)


@dataclass
class CalibrationData:
    """Calibration batches, held-out batches for the fallback search, and where they came from."""

    feeds: list[Feed]
    held_out: list[Feed]
    source: CalibrationSource
    path: Path | None = None
    samples: int = 0
    held_out_samples: int = 0
    warnings: list[str] = field(default_factory=list)
    search: list[Feed] = field(default_factory=list)
    search_samples: int = 0
    # the text of each row of each held-out / search batch (text calibration only)
    held_out_texts: list[list[str]] = field(default_factory=list)
    search_texts: list[list[str]] = field(default_factory=list)
    # samples per length stratum in each split, e.g. {"calibration": {"short": 4, ...}}
    strata: dict[str, dict[str, int]] = field(default_factory=dict)
    # the check split: consulted by the search after each round (never the held-out one)
    check: list[Feed] = field(default_factory=list)
    check_samples: int = 0
    check_texts: list[list[str]] = field(default_factory=list)
    # short texts made from the calibration and search lines (``short_samples``):
    # decision samples only
    prefixes: list[Feed] = field(default_factory=list)
    prefix_texts: list[list[str]] = field(default_factory=list)
    # the calibration split's samples batched tightly, to judge a model on (text only; the
    # calibration itself runs ``feeds``, padded as served): ``judged_calibration``
    calibration_tight: list[Feed] = field(default_factory=list)
    calibration_texts: list[list[str]] = field(default_factory=list)

    def judged_calibration(self) -> tuple[list[Feed], list[list[str]]]:
        """The calibration split's samples as a model is judged on them (and the text of each
        row when known): tight batches of its lines (text), else its calibration batches."""
        if self.calibration_tight:
            return self.calibration_tight, self.calibration_texts
        return self.feeds, []


# Short-input augmentation: at most this many short texts made from the calibration and
# search lines join the search's decision samples (mean pooling over few tokens is where
# INT8 error shows; a file with few short lines left the search blind to them).
MAX_SHORT_SAMPLES = 32


def short_samples(texts: Sequence[str], limit: int = MAX_SHORT_SAMPLES) -> list[str]:
    """Short texts from every line of three words or more: its first 1, 2 or 3 words and
    its last 2 or 3 words (in turn), each ending with the line's own punctuation mark when
    it has one; distinct, none a line of ``texts`` itself, at most ``limit``."""
    found: list[str] = []
    for k, text in enumerate(t for t in texts if len(t.split()) >= 3):
        words = text.split()
        mark = text[-1] if text[-1] in ".!?" else ""
        head = " ".join(words[:1 + k % 3]).rstrip(",;:.!?")
        tail = " ".join(words[-(2 + k % 2):]).rstrip(",;:.!?")
        for short in (head + mark, tail[:1].upper() + tail[1:] + mark):
            if short.strip(".!?") and short not in found and short not in texts:
                found.append(short)
        if len(found) >= limit:
            break
    return found[:limit]


def calibration_path(plan: BuildPlan) -> Path | None:
    """``--calibration`` if given, else the recipe's ``precision_options.int8.calibration``."""
    if plan.calibration is not None:
        return Path(plan.calibration)
    configured = plan.recipe.precision_options.int8.calibration
    return Path(configured) if configured else None


def synthetic_feeds(recipe: Recipe, profiles: Sequence[ShapeProfile], samples: int,
                    seed: int, vocab_size: int | None = None) -> list[Feed]:
    """Random in-vocabulary inputs at every profile corner, cycled until ``samples`` rows."""
    from trtpack.verify.samples import make_inputs

    vocab = vocab_size or architectures.vocab_size(recipe.config)
    specs = recipe.input_specs()
    corners = [shapes for p in profiles for _, shapes in p.corners()]
    feeds: list[Feed] = []
    total = 0
    i = 0
    while total < samples:
        shapes = corners[i % len(corners)]
        feed = make_inputs(specs, shapes, tokenizer=None, vocab_size=vocab, seed=seed + 7919 * i,
                           values=recipe.value_rules())
        feeds.append(feed)
        total += next(iter(feed.values())).shape[0] if feed else 1
        i += 1
    return feeds


def feed_rows(feeds: Sequence[Feed]) -> int:
    return sum(next(iter(f.values())).shape[0] for f in feeds if f)


def load_build_calibration(plan: BuildPlan, onnx: Path,
                           tokenizer: Callable[[], Tokenizer | None]
                           ) -> tuple[CalibrationData, Tokenizer | None]:
    """The calibration data of an INT8 build, read the same way by both INT8 paths (the
    precision stage's Q/DQ conversion and the CPU model's INT8 forms): ``calibration_path``'s
    file (none: the shipped default text for a model with a tokenizer, else synthetic
    inputs), text tokenized with ``tokenizer()`` (not called for a ``.npz``), the recipe's
    sample limit, the plan's seed, and ``onnx``'s vocabulary; and the tokenizer used."""
    path = calibration_path(plan)
    text = path is None or path.suffix.lower() != ".npz"
    used = tokenizer() if text else None
    recipe = plan.recipe
    data = load_calibration(recipe, plan.profiles, path, tokenizer=used,
                            max_samples=recipe.precision_options.int8.max_calibration_samples,
                            seed=plan.seed, vocab_size=graph_vocab_size(onnx, recipe))
    return data, used


def graph_vocab_size(model: Path, recipe: Recipe) -> int | None:
    """The token ids ``model`` takes (its embedding table's rows), or None when it has no
    token-ids input or the table is not found."""
    from trtpack.onnx_tools.vocab import vocab_from_graph

    token_spec = token_ids_spec(recipe)
    return vocab_from_graph(model, token_spec.name) if token_spec is not None else None


def load_calibration(recipe: Recipe, profiles: Sequence[ShapeProfile], path: Path | None, *,
                     tokenizer: Tokenizer | None, max_samples: int, seed: int,
                     vocab_size: int | None = None) -> CalibrationData:
    """Calibration, search and held-out batches from ``path`` (text, tokenized with
    ``tokenizer``, or .npz: its token ids checked against ``vocab_size``, the rows of the
    model's embedding table), or synthetic ones."""
    if max_samples < 1:
        raise UserInputError("precision_options.int8.max_calibration_samples must be >= 1")
    if path is None and tokenizer is not None and token_ids_spec(recipe) is not None:
        path = DEFAULT_TEXT
    if path is None:
        feeds = synthetic_feeds(recipe, profiles, min(max_samples, SYNTHETIC_SAMPLES), seed)
        held_out = synthetic_feeds(recipe, profiles, 4, seed + 1_000_003)
        search = synthetic_feeds(recipe, profiles, 4, seed + 2_000_003)
        return CalibrationData(feeds, held_out, "synthetic", None, feed_rows(feeds),
                               feed_rows(held_out), [SYNTHETIC_WARNING], search,
                               feed_rows(search))
    if path.suffix.lower() == ".npz":
        arrays, warnings = read_npz_samples(path, recipe)
        token_spec = token_ids_spec(recipe)
        if token_spec is not None:
            check_token_ids(arrays[token_spec.name], vocab_size,
                            f"calibration file {path}: '{token_spec.name}'")
        lengths = npz_lengths(arrays, recipe)
        splits = split_three(lengths, max_samples, seed)
        return CalibrationData(
            npz_feeds(arrays, splits.calibration, recipe, profiles),
            npz_feeds(arrays, splits.held_out, recipe, profiles) if splits.held_out else [],
            "npz", path, len(splits.calibration), len(splits.held_out), warnings,
            npz_feeds(arrays, splits.search, recipe, profiles) if splits.search else [],
            len(splits.search), strata=strata_counts(lengths, splits),
            check=npz_feeds(arrays, splits.check, recipe, profiles) if splits.check else [],
            check_samples=len(splits.check))
    texts = read_text_samples(path)
    text_inputs(recipe)
    if tokenizer is None:
        raise UserInputError(
            f"calibration file {path} is text, but recipe '{recipe.name}' has no tokenizer to "
            "tokenize it with; give a .npz of input arrays instead"
        )
    token_spec = token_ids_spec(recipe)
    assert token_spec is not None
    longest = sequence_buckets(token_spec, profiles)[-1].seq
    lengths = token_counts(texts, tokenizer, longest + 1)
    fits = [i for i, n in enumerate(lengths) if n <= longest]
    if not fits:
        raise UserInputError(
            f"calibration file {path}: every sample is longer than the largest profile takes "
            f"({longest} tokens); expected one sample a line that fits the profiles")
    warnings = []
    if len(fits) < len(texts):
        warnings.append(f"calibration file {path}: {len(texts) - len(fits)} samples longer "
                        f"than the largest profile ({longest} tokens) are truncated")
    if path != DEFAULT_TEXT and not any(stratum(n) == "short" for n in lengths):
        texts, lengths, added = with_default_short_lines(texts, lengths, tokenizer, seed)
        warnings.append(
            f"calibration file {path} has no short inputs (<= {SHORT_TOKENS} tokens), where "
            f"INT8 error shows most: {added} short lines of trtpack's default text were added "
            "to every split (the held-out figure covers short inputs too)")
    warnings += strata_warnings(path, lengths)
    splits = split_three(lengths, max_samples, seed)
    feeds = text_feeds([texts[i] for i in splits.calibration], tokenizer, recipe, profiles)
    calibration_tight, calibration_texts = tight_text_feeds(
        [texts[i] for i in splits.calibration], tokenizer, recipe, profiles)
    # short replies of the shipped text, whatever the file: some join the decisions, others
    # (a disjoint draw) the held-out split, so that its figure covers them too
    replies = default_short_lines(texts, tokenizer, seed,
                                  DECISION_SHORT_LINES + HELD_OUT_SHORT_LINES) \
        if path != DEFAULT_TEXT and splits.held_out else []
    held_lines = [*(texts[i] for i in splits.held_out), *replies[DECISION_SHORT_LINES:]]
    held_out, held_out_texts = tight_text_feeds(held_lines, tokenizer, recipe, profiles) \
        if splits.held_out else ([], [])
    search, search_texts = tight_text_feeds(
        [texts[i] for i in splits.search], tokenizer, recipe, profiles) \
        if splits.search else ([], [])
    check, check_texts = tight_text_feeds(
        [texts[i] for i in splits.check], tokenizer, recipe, profiles) \
        if splits.check else ([], [])
    prefix_lines = short_samples([texts[i] for i in [*splits.search, *splits.calibration]])
    prefix_lines += replies[:DECISION_SHORT_LINES]
    prefixes, prefix_texts = tight_text_feeds(prefix_lines, tokenizer, recipe, profiles) \
        if prefix_lines and splits.held_out else ([], [])
    source: CalibrationSource = "default text" if path == DEFAULT_TEXT else "text"
    return CalibrationData(feeds, held_out, source, path, len(splits.calibration),
                           len(held_lines), warnings, search, len(splits.search),
                           held_out_texts, search_texts, strata_counts(lengths, splits),
                           check, len(splits.check), check_texts, prefixes, prefix_texts,
                           calibration_tight, calibration_texts)


# Short lines of the default text added to a calibration file that has none.
DEFAULT_SHORT_LINES = 40

# Short lines of the default text the search also decides on, whatever the file (the
# search and calibration splits of a questions-only file held no "Thanks!" or "Sure.", and
# its Q/DQ model fell to 0.986 on such replies while its decisions said 0.998).
DECISION_SHORT_LINES = 48

# ... and this many others (never decided on) join the held-out split.
HELD_OUT_SHORT_LINES = 16


def default_short_lines(texts: Sequence[str], tokenizer: Tokenizer, seed: int, count: int
                        ) -> list[str]:
    """Up to ``count`` short lines (<= ``SHORT_TOKENS`` tokens) of the default text that are
    not in ``texts``, drawn with ``seed``."""
    lines = [t for t in read_text_samples(DEFAULT_TEXT) if t not in texts]
    counts = token_counts(lines, tokenizer, SHORT_TOKENS + 1)
    short = [t for t, n in zip(lines, counts, strict=True) if stratum(n) == "short"]
    rng = np.random.default_rng(seed)
    return [short[i] for i in sorted(rng.permutation(len(short))[:count].tolist())]


def with_default_short_lines(texts: list[str], lengths: list[int], tokenizer: Tokenizer,
                             seed: int) -> tuple[list[str], list[int], int]:
    """``texts`` (and their token counts) with up to ``DEFAULT_SHORT_LINES`` short lines of
    the default text (drawn with ``seed``) added: a file without short inputs would leave
    short inputs out of the search's decisions and out of the held-out figure alike, and
    on MiniLM a search calibrated on long sentences alone kept a model at 0.963 on
    "Sure thing." while its held-out split said 0.998."""
    added = default_short_lines(texts, tokenizer, seed, DEFAULT_SHORT_LINES)
    new_counts = token_counts(added, tokenizer, SHORT_TOKENS + 1)
    return [*texts, *added], [*lengths, *new_counts], len(added)


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
