"""Calibration files: a UTF-8 text file (one sample a line) or a ``.npz`` (one array per
model input, samples along the first axis: ModelOpt's own format), read and checked
against the recipe; every fault in one is the user's (exit 2, the file named)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from trtpack.errors import UserInputError, first_line
from trtpack.onnx_tools.files import sha256_file
from trtpack.precision.calibration.splits import MEDIUM_TOKENS
from trtpack.precision.calibration.text_batches import (
    Feed,
    chunks,
    sequence_buckets,
    token_ids_spec,
)
from trtpack.shapes import ShapeProfile
from trtpack.sources.recipe import Recipe


def file_sha256(path: Path) -> str:
    """sha256 of a calibration file; unreadable is the user's error (exit 2)."""
    try:
        return sha256_file(path)
    except OSError as e:
        raise UserInputError(f"cannot read calibration file {path}: {e.strerror}") from None


KINDS = ("a text file (one sample a line), a .jsonl with a \"text\" field on each line, or a "
         ".npz of input arrays")
JSONL_SUFFIX = ".jsonl"
JSONL_FIELD = "text"


def check_calibration_path(path: Path) -> None:
    """A calibration path that is missing or not a file (a folder) is the user's error."""
    if path.is_dir():
        raise UserInputError(f"--calibration '{path}' is a folder; give a file: {KINDS}")
    if not path.exists():
        raise UserInputError(f"calibration file '{path}' does not exist")
    if not path.is_file():
        raise UserInputError(f"--calibration '{path}' is not a regular file; give {KINDS}")


def jsonl_texts(path: Path, text: str) -> list[str]:
    """The ``"text"`` field of each line of a JSON Lines file (``{"text": "..."}``, as
    Hugging Face datasets write them); a line without one is the user's error, named."""
    import json

    samples = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise UserInputError(f"calibration file {path}, line {number}: not JSON ({e}); a "
                                 f".jsonl holds one JSON object a line") from None
        value = record.get(JSONL_FIELD) if isinstance(record, dict) else None
        if not isinstance(value, str):
            keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
            raise UserInputError(
                f"calibration file {path}, line {number}: no \"{JSONL_FIELD}\" string field "
                f"(found: {keys or 'nothing'})",
                hint="write one {\"text\": \"...\"} object a line, or give a plain text file "
                "with one sample a line")
        samples.append(value)
    return samples


def read_text_samples(path: Path) -> list[str]:
    """Non-blank lines of a UTF-8 text file, stripped, or the ``"text"`` field of each line of
    a ``.jsonl``; a file without any is a user error."""
    check_calibration_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserInputError(
            f"calibration file {path} is not UTF-8 text (byte {e.start}); give a text file "
            "with one sample a line, or a .npz of input arrays"
        ) from None
    except OSError as e:
        raise UserInputError(f"cannot read calibration file {path}: {e.strerror}") from None
    lines = jsonl_texts(path, text) if path.suffix.lower() == JSONL_SUFFIX \
        else text.splitlines()
    samples = [line.strip() for line in lines]
    samples = [s for s in samples if s and "\x00" not in s]
    if not samples:
        raise UserInputError(
            f"calibration file {path} has no usable samples: expected one text sample a line"
        )
    return samples


def read_npz_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of a .npz (a zip of .npy files), or a ``UserInputError`` naming the file:
    not a zip, a damaged one (bad CRC, truncated), members encrypted or compressed with a
    method numpy's files never use, or an array that does not parse."""
    import zipfile
    import zlib

    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.flag_bits & 0x1 or info.compress_type not in (zipfile.ZIP_STORED,
                                                                       zipfile.ZIP_DEFLATED):
                    raise UserInputError(
                        f"calibration file {path} is not a readable .npz: member "
                        f"'{info.filename}' is encrypted or compressed with another method "
                        "than numpy writes")
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        first = first_line(e)[:200]
        raise UserInputError(f"calibration file {path} is not a readable .npz: {first}"
                             ) from None


def read_npz_samples(path: Path, recipe: Recipe) -> tuple[dict[str, np.ndarray], list[str]]:
    """One array per model input with samples along axis 0, validated against the recipe."""
    check_calibration_path(path)
    warnings: list[str] = []
    arrays = read_npz_arrays(path)
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
    for chunk in chunks(idx, max(1, size), min_size):
        feeds.append({s.name: np.ascontiguousarray(arrays[s.name][chunk]) for s in specs})
    return feeds


def npz_lengths(arrays: Mapping[str, np.ndarray], recipe: Recipe) -> list[int]:
    """Unpadded length of each .npz sample (its attention-mask sum), for the strata."""
    mask = recipe.input_name("attention_mask")
    n = next(iter(arrays.values())).shape[0]
    if mask is None or arrays[mask].ndim != 2:
        return [MEDIUM_TOKENS] * n
    return [int(v) for v in (arrays[mask] != 0).sum(axis=1)]


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
    if not recipe.tokenizer:
        raise UserInputError(
            f"calibration file {path} is text, but recipe '{recipe.name}' has no tokenizer to "
            "tokenize it with; give a .npz of input arrays instead")
    token_spec = token_ids_spec(recipe)
    if token_spec is None:
        return
    longest = sequence_buckets(token_spec, profiles)[-1].seq
    if all(len(t.split()) > longest for t in texts):
        raise UserInputError(
            f"calibration file {path}: every line is longer than the largest profile takes "
            f"({longest} tokens); expected one sample a line that fits the profiles")
