"""``--sample-inputs FILE.npz``: real inputs (images, audio, token ids) for verification and
calibration, one array per input named by it, the batch on the input's batch axis (the
first, or wherever ``batch`` is), a scalar as a 0-d array. Checked before any work (names,
dtypes, ranks, static sizes, token ids within the vocabulary: exit 2 naming the problem);
at a profile corner the samples are used when their non-batch sizes fit it (rows repeated
to the corner's batch), and a corner no sample fits gets generated inputs (the stage warns,
listing them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trtpack.errors import UserInputError
from trtpack.shapes import BATCH_AXIS, Shape, TensorSpec
from trtpack.sources.recipe import Recipe

if TYPE_CHECKING:
    from trtpack.options import BuildPlan


def load_sample_arrays(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise UserInputError(f"--sample-inputs '{path}' does not exist")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: np.asarray(data[k]) for k in data.files}
    except (OSError, ValueError) as e:
        raise UserInputError(f"--sample-inputs '{path}' is not a readable .npz of arrays "
                             f"({e})", hint="np.savez(FILE, NAME=array, ...): one array per "
                             "input, the batch on the first axis") from None


def sample_constants(path: Path, names: list[str]) -> list[str]:
    """``NAME=VALUE`` for each input of ``names`` (one-element integer inputs with no value
    rule) whose array in the ``--sample-inputs`` file holds one value throughout (a sample
    rate): the value the user's data gives it, as ``--input NAME=VALUE`` would."""
    arrays = load_sample_arrays(path)
    found = []
    for name in names:
        a = arrays.get(name)
        if a is not None and a.size and a.dtype.kind in "iu" and (a == a.flat[0]).all():
            found.append(f"{name}={int(a.flat[0])}")
    return found


def _batch_axis(spec: TensorSpec) -> int | None:
    """Where an input's batch is (a recurrent state carries it second), or None."""
    return spec.axes.index(BATCH_AXIS) if BATCH_AXIS in spec.axes else None


def check_token_ids(ids: np.ndarray, vocab_size: int | None, where: str) -> None:
    """Token ids outside ``[0, vocab_size)`` are bad input (exit 2), said before ONNX
    Runtime's Gather meets them; nothing is checked when the vocabulary is unknown."""
    if vocab_size is None or not ids.size or (ids.min() >= 0 and ids.max() < vocab_size):
        return
    bad = int(ids.max()) if ids.max() >= vocab_size else int(ids.min())
    raise UserInputError(f"{where} holds token id {bad}, outside the vocabulary "
                         f"[0, {vocab_size})", hint="token ids of this model's tokenizer, or "
                         "--set vocab_size=N when the vocabulary is another")


def read_sample_inputs(path: Path, recipe: Recipe, vocab_size: int | None = None
                       ) -> dict[str, np.ndarray]:
    """The checked arrays of ``path`` for ``recipe``'s inputs (an input with a value rule
    may be left out: its rule feeds it)."""
    arrays = load_sample_arrays(path)
    specs = {s.name: s for s in recipe.input_specs()}
    where = f"--sample-inputs '{path}'"
    unknown = sorted(set(arrays) - set(specs))
    if unknown:
        raise UserInputError(f"{where}: {', '.join(unknown)} is not an input of "
                             f"'{recipe.name}'; its inputs are {', '.join(specs)}")
    rules = recipe.value_rules()
    missing = [n for n in specs if n not in arrays and n not in rules]
    if missing:
        raise UserInputError(f"{where} has no array for {', '.join(missing)}",
                             hint="give every input an array, or a value rule with "
                             "--input NAME=VALUE")
    rows: dict[str, int] = {}
    for name, a in arrays.items():
        spec = specs[name]
        if a.ndim != spec.rank:
            raise UserInputError(f"{where}: '{name}' has {a.ndim} dimension(s) "
                                 f"{list(a.shape)}, the input has {spec.rank} "
                                 f"({', '.join(map(str, spec.axes))})")
        for d, axis in enumerate(spec.axes):
            if isinstance(axis, int) and a.shape[d] != axis:
                raise UserInputError(f"{where}: '{name}' dimension {d} is {a.shape[d]}, the "
                                     f"input's is fixed at {axis}")
        want = np.dtype(spec.dtype)
        kinds_fit = (want.kind == a.dtype.kind or (want.kind in "iu" and a.dtype.kind in "iu")
                     or (want.kind == "f" and a.dtype.kind == "f"))
        if not kinds_fit:
            raise UserInputError(f"{where}: '{name}' is {a.dtype}, the input is {want}")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise UserInputError(f"{where}: '{name}' holds NaN or infinite values")
        if spec.kind == "token_ids":
            check_token_ids(a, vocab_size, f"{where}: '{name}'")
        batch_axis = _batch_axis(spec)
        if batch_axis is not None:
            rows[name] = a.shape[batch_axis]
    if len(set(rows.values())) > 1:
        raise UserInputError(f"{where}: the inputs have different numbers of samples {rows}")
    return {n: a.astype(specs[n].dtype) for n, a in arrays.items()}


def corner_feed(samples: Mapping[str, np.ndarray], specs: Sequence[TensorSpec],
                shapes: Mapping[str, Shape]) -> dict[str, np.ndarray] | None:
    """The samples at one corner (``shapes``), their rows repeated or cut to its batch, or
    None when a sample's non-batch sizes do not fit it."""
    feed: dict[str, np.ndarray] = {}
    for spec in specs:
        a = samples.get(spec.name)
        if a is None:
            continue
        shape = tuple(shapes[spec.name])
        axis = _batch_axis(spec)
        if axis is not None:
            others = [d for d in range(a.ndim) if d != axis]
            if [a.shape[d] for d in others] != [shape[d] for d in others] or not a.shape[axis]:
                return None
            feed[spec.name] = np.take(a, np.arange(shape[axis]) % a.shape[axis], axis=axis)
        elif a.shape == shape:
            feed[spec.name] = a
        else:
            return None
    return feed


class SampleInputs:
    """A stage's use of ``--sample-inputs``: ``use`` puts the samples into a corner's
    generated feed where they fit, ``unfitted`` lists the corners they did not fit."""

    def __init__(self, samples: Mapping[str, np.ndarray] | None,
                 specs: Sequence[TensorSpec]) -> None:
        self.samples = samples
        self.specs = specs
        self.unfitted: list[str] = []

    @classmethod
    def of(cls, plan: BuildPlan, vocab_size: int | None = None) -> SampleInputs:
        """The samples of ``plan.sample_inputs`` (a ``BuildPlan``), or none."""
        path = plan.sample_inputs
        recipe = plan.recipe
        samples = read_sample_inputs(path, recipe, vocab_size) if path is not None else None
        return cls(samples, recipe.input_specs())

    def use(self, feed: dict[str, np.ndarray], shapes: Mapping[str, Shape]) -> bool:
        """Put the samples into ``feed`` (generated at ``shapes``) where they fit; False when
        there are samples and they do not fit this corner."""
        if self.samples is None:
            return True
        fitted = corner_feed(self.samples, self.specs, shapes)
        if fitted is None:
            return False
        feed.update(fitted)
        return True

    def trace(self, path: Path | None, corners: int) -> str | None:
        """Where the samples came from and where they were fed, for the stage's message and
        metrics: ``samples from FILE at 3/3 corners`` (None without ``--sample-inputs``)."""
        if self.samples is None or path is None:
            return None
        return f"samples from {path.name} at {corners - len(self.unfitted)}/{corners} corners"

    def warnings(self) -> list[str]:
        if self.samples is None or not self.unfitted:
            return []
        return [f"--sample-inputs: no sample fits {', '.join(self.unfitted)} (their sizes "
                "differ from the corner's); generated inputs were used there"]


def file_state(path: Path | None) -> str | None:
    """What a stage's cache key holds of a --sample-inputs file: its content's sha256."""
    if path is None:
        return None
    from trtpack.onnx_tools.files import sha256_file

    return sha256_file(path)
