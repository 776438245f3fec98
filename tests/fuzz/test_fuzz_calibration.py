"""Fuzzed INT8 calibration files: text files (edited, truncated, bit-flipped, not UTF-8,
blank, over-long lines) and .npz files (arrays dropped, added, of the wrong rank, dtype or
sample count, NaN, damaged zip bytes), read in-process by the up-front check and the loader
(``check_calibration_input``, ``load_calibration``). Each is calibration data or a
``UserInputError`` naming the file, never another exception."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.mutations import Counter, damaged_bytes, edited_text, fuzz_settings, min_examples
from trtpack.errors import UserInputError
from trtpack.precision.calibration.data import load_calibration
from trtpack.precision.calibration.files import check_calibration_input
from trtpack.shapes import parse_profiles
from trtpack.sources.resolve import resolve_model

MIN_EXAMPLES = 500
RECIPE = resolve_model("tiny-bert")  # input_ids, attention_mask, token_type_ids
PROFILES = parse_profiles(["1x4:2x8:4x16"], RECIPE.input_specs())
SENTENCES = ["The cat sat on the mat.", "A quick brown fox jumps over the lazy dog.",
             "Compilers turn models into engines.", "short", "Où est la gare ?",
             "Numbers like 3.14 and 42 appear too.", "An unusually long line " * 4]


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    from tests.hf_models import minilm_dir

    return AutoTokenizer.from_pretrained(str(minilm_dir()))


@st.composite
def calibration_text(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(st.sampled_from(SENTENCES), min_size=0, max_size=12))
    text = "\n".join(lines)
    how = draw(st.sampled_from(["edit", "edit", "bytes", "odd"]))
    if how == "edit":
        return draw(edited_text(st.just(text), max_edits=5)).encode("utf-8", "surrogatepass")
    if how == "bytes":
        return draw(damaged_bytes(text.encode() or b"x"))
    return draw(st.sampled_from([b"", b"\n\n  \n", b"\x00\x00", b"\xff\xfe" + text.encode(),
                                 ("word " * 500).encode(), b"\r\n".join([b"a", b"b"]),
                                 "\u2028".join(lines).encode()]))


def _check(path: Path, run: Any) -> None:
    try:
        run()
    except UserInputError as e:
        message = str(e)
        assert str(path) in message or "max_calibration_samples" in message, message


def test_text_calibration_fuzzed() -> None:
    seen = Counter("calibration text")
    tokenizer = _tokenizer()
    path = Path(tempfile.mkdtemp(prefix="trtpack-fuzz-cal-")) / "sentences.txt"

    @fuzz_settings(600)
    @given(content=calibration_text(), samples=st.sampled_from([1, 3, 128]))
    def check(content: bytes, samples: int) -> None:
        seen()
        path.write_bytes(content)
        _check(path, lambda: check_calibration_input(path, RECIPE, PROFILES))

        def load() -> None:
            data = load_calibration(RECIPE, PROFILES, path, tokenizer=tokenizer,
                                    max_samples=samples, seed=0)
            assert data.source == "text" and data.feeds and data.samples >= 1
            for feed in data.feeds:
                assert set(feed) == {s.name for s in RECIPE.input_specs()}

        _check(path, load)

    check()
    assert seen.count >= min_examples(MIN_EXAMPLES)


NAMES = [s.name for s in RECIPE.input_specs()]
DTYPES = [np.int64, np.int32, np.int8, np.uint16, np.float32, np.float16, np.bool_,
          np.complex64, "U3", "S2"]


@st.composite
def npz_arrays(draw: st.DrawFn) -> dict[str, np.ndarray]:
    """Valid arrays (one per input, samples x sequence) with some of them changed."""
    rows, seq = draw(st.integers(1, 6)), draw(st.integers(1, 20))
    rng = np.random.default_rng(draw(st.integers(0, 100)))
    arrays = {"input_ids": rng.integers(0, 1000, (rows, seq)),
              "attention_mask": np.ones((rows, seq), np.int64),
              "token_type_ids": np.zeros((rows, seq), np.int64)}
    base = arrays["input_ids"]
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from([*NAMES, "extra"]))
        op = draw(st.sampled_from(["drop", "dtype", "rank", "rows", "nan", "scalar", "add"]))
        a = arrays.get(name, base)
        if op == "drop":
            arrays.pop(name, None)
        elif op == "dtype":
            try:
                with np.errstate(invalid="ignore"):  # NaN made int by the mutation itself
                    arrays[name] = a.astype(draw(st.sampled_from(DTYPES)))
            except (OverflowError, ValueError):  # numpy refuses that cast (text -> int8)
                pass
        elif op == "rank":
            arrays[name] = a.reshape(-1) if draw(st.booleans()) else a[..., None]
        elif op == "rows":
            arrays[name] = a[:draw(st.integers(0, max(0, a.shape[0] - 1)))] \
                if a.ndim else a
        elif op == "nan":
            f = a.astype(np.float32)
            if f.size:
                f.flat[0] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
            arrays[name] = f
        elif op == "scalar":
            arrays[name] = np.array(7)
        else:
            arrays[name] = a.copy()
    return arrays


@st.composite
def npz_file(draw: st.DrawFn) -> bytes:
    buffer = io.BytesIO()
    arrays = draw(npz_arrays())
    (np.savez_compressed if draw(st.booleans()) else np.savez)(buffer, **arrays)
    data = buffer.getvalue()
    if draw(st.integers(0, 3)) == 0:
        data = draw(damaged_bytes(data, focus=256))
    return data


def test_npz_calibration_fuzzed() -> None:
    seen = Counter("calibration npz")
    path = Path(tempfile.mkdtemp(prefix="trtpack-fuzz-npz-")) / "inputs.npz"

    @fuzz_settings(600)
    @given(content=npz_file(), samples=st.sampled_from([1, 4, 128]))
    def check(content: bytes, samples: int) -> None:
        seen()
        path.write_bytes(content)
        _check(path, lambda: check_calibration_input(path, RECIPE, PROFILES))

        def load() -> None:
            data = load_calibration(RECIPE, PROFILES, path, tokenizer=None,
                                    max_samples=samples, seed=0)
            assert data.source == "npz" and data.samples >= 1
            for feed in data.feeds:
                assert {k: v.dtype for k, v in feed.items()} == {
                    s.name: np.dtype(s.dtype) for s in RECIPE.input_specs()}

        _check(path, load)

    check()
    assert seen.count >= min_examples(MIN_EXAMPLES)
