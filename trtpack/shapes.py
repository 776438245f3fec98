"""Tensor specs with symbolic axes, and shape profiles (min/opt/max) with their parser.

The axis names declared in a recipe ("batch", "sequence", ...) are the single source for the
ONNX dynamic axes, the TensorRT optimization profiles and the Triton dims.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from trtpack.errors import ProfileError

Dim = str | int
"""A dimension: a symbolic (dynamic) axis name, or a static size."""

CORNERS = ("min", "opt", "max")
BATCH_AXIS = "batch"


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output: name, numpy dtype name, axes, and what its values are."""

    name: str
    dtype: str
    axes: tuple[Dim, ...]
    kind: str = "generic"

    @property
    def rank(self) -> int:
        return len(self.axes)

    @property
    def dynamic_axes(self) -> dict[int, str]:
        return {i: a for i, a in enumerate(self.axes) if isinstance(a, str)}

    @property
    def has_dynamic_batch(self) -> bool:
        return bool(self.axes) and self.axes[0] == BATCH_AXIS


Shape = tuple[int, ...]
TrtProfile = dict[str, tuple[Shape, Shape, Shape]]
"""One optimization profile as TensorRT takes it: input name -> (min, opt, max)
(``engine.builder.tensorrt_profiles`` makes them from ``ShapeProfile``s, ``runtimes``
hands them to polygraphy)."""


@dataclass(frozen=True)
class ShapeRange:
    min: Shape
    opt: Shape
    max: Shape

    def corner(self, which: str) -> Shape:
        return {"min": self.min, "opt": self.opt, "max": self.max}[which]

    def __str__(self) -> str:
        return ":".join("x".join(str(d) for d in s) for s in (self.min, self.opt, self.max))


@dataclass(frozen=True)
class ShapeProfile:
    """One optimization profile: a min/opt/max shape for every input."""

    shapes: Mapping[str, ShapeRange] = field(default_factory=dict)

    def corners(self) -> Iterator[tuple[str, dict[str, Shape]]]:
        """Yield ("min", {input: shape}), ("opt", ...), ("max", ...)."""
        for which in CORNERS:
            yield which, {name: r.corner(which) for name, r in self.shapes.items()}

    def axis_range(self, axis_index: int = 0) -> tuple[int, int, int]:
        """(min, opt, max) of one dimension, taken across all inputs (smallest max wins)."""
        ranges = [r for r in self.shapes.values() if len(r.min) > axis_index]
        return (
            max(r.min[axis_index] for r in ranges),
            max(r.opt[axis_index] for r in ranges),
            min(r.max[axis_index] for r in ranges),
        )

    def __str__(self) -> str:
        return ",".join(f"{name}={r}" for name, r in self.shapes.items())

    def to_dict(self) -> dict[str, dict[str, list[int]]]:
        return {
            name: {"min": list(r.min), "opt": list(r.opt), "max": list(r.max)}
            for name, r in self.shapes.items()
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, Sequence[int]]]) -> ShapeProfile:
        return cls(
            {
                name: ShapeRange(tuple(r["min"]), tuple(r["opt"]), tuple(r["max"]))
                for name, r in data.items()
            }
        )


_SHAPE_RE = re.compile(r"^[0-9]+(x[0-9]+)*$")
MAX_DIM = 2**31 - 1  # TensorRT's dimensions are int32


def _quoted(text: str, limit: int = 60) -> str:
    """``text`` for an error message: quoted, long ones cut (a pasted file stays one line)."""
    text = text if len(text) <= limit else text[:limit - 3] + "..."
    return repr(text) if any(not c.isprintable() for c in text) else f"'{text}'"


def _parse_shape(text: str, where: str) -> Shape:
    text = text.strip().lower()
    if not _SHAPE_RE.match(text):
        raise ProfileError(
            f"{where}: {_quoted(text)} is not a shape; expected sizes joined by 'x', e.g. 16x128"
        )
    sizes = text.split("x")
    too_big = next((d for d in sizes if len(d) > 10 or int(d) > MAX_DIM), None)
    if too_big is not None:
        raise ProfileError(f"{where}: size {_quoted(too_big, 20)} is larger than {MAX_DIM}")
    return tuple(int(d) for d in sizes)


def _parse_range(text: str, where: str) -> tuple[Shape, Shape, Shape]:
    parts = text.split(":")
    if len(parts) == 1:
        shape = _parse_shape(parts[0], where)
        return shape, shape, shape
    if len(parts) != 3:
        raise ProfileError(
            f"{where}: {_quoted(text)} must be MIN:OPT:MAX (e.g. 1x128:16x128:128x128) or one shape"
        )
    mn, opt, mx = (_parse_shape(p, where) for p in parts)
    if not len(mn) == len(opt) == len(mx):
        raise ProfileError(f"{where}: min, opt and max in {_quoted(text)} have different ranks")
    return mn, opt, mx


def model_axis_names(inputs: Sequence[TensorSpec]) -> list[str]:
    """Distinct dynamic axis names of the inputs, in order of first appearance."""
    names: list[str] = []
    for spec in inputs:
        for axis in spec.axes:
            if isinstance(axis, str) and axis not in names:
                names.append(axis)
    return names


def _fill_from_axes(
    spec: TensorSpec, axis_values: Mapping[str, tuple[int, int, int]], where: str
) -> ShapeRange:
    corners: list[list[int]] = [[], [], []]
    for axis in spec.axes:
        for i in range(3):
            if isinstance(axis, int):
                corners[i].append(axis)
            elif axis in axis_values:
                corners[i].append(axis_values[axis][i])
            else:
                raise ProfileError(
                    f"{where}: no size for axis '{axis}' of input '{spec.name}'; "
                    f"give it with '{spec.name}=MIN:OPT:MAX'"
                )
    return ShapeRange(tuple(corners[0]), tuple(corners[1]), tuple(corners[2]))


def _range_for_input(
    spec: TensorSpec, rng: tuple[Shape, Shape, Shape], where: str
) -> ShapeRange:
    """Accept a full shape (rank of the input) or only its dynamic dims, in order."""
    n = len(rng[0])
    if n == spec.rank:
        return ShapeRange(*rng)
    dyn = spec.dynamic_axes
    if n == len(dyn):
        values = {name: (rng[0][k], rng[1][k], rng[2][k]) for k, name in enumerate(dyn.values())}
        return _fill_from_axes(spec, values, where)
    raise ProfileError(
        f"{where}: input '{spec.name}' has rank {spec.rank} {_axes_str(spec)}; "
        f"the profile gives {n} dimension(s)"
    )


def _axes_str(spec: TensorSpec) -> str:
    return "(" + ", ".join(str(a) for a in spec.axes) + ")"


def parse_profile(text: str, inputs: Sequence[TensorSpec]) -> ShapeProfile:
    """Parse one ``--profile`` value against the model's inputs and validate it.

    Forms:
      ``1x128:16x128:128x128`` -- sizes of the model's dynamic axes in order (e.g. batch x
      sequence), applied to every input with those axes; a full input shape also works.
      ``input_ids=1x128:16x128:128x128,attention_mask=...`` -- per input; inputs not named
      take their sizes from the axes of those that are.
    """
    text = text.strip()
    where = f"profile {_quoted(text)}"
    if not text:
        raise ProfileError("empty profile; expected e.g. 1x128:16x128:128x128")
    by_name = {s.name: s for s in inputs}
    shapes: dict[str, ShapeRange] = {}
    if "=" in text:
        for item in text.split(","):
            if "=" not in item:
                raise ProfileError(f"{where}: {_quoted(item)} must be NAME=MIN:OPT:MAX")
            name, _, rng_text = item.partition("=")
            name = name.strip()
            if name not in by_name:
                raise ProfileError(
                    f"{where}: the model has no input {_quoted(name)}; its inputs are "
                    + ", ".join(by_name)
                )
            shapes[name] = _range_for_input(by_name[name], _parse_range(rng_text, where), where)
        axis_values = _axis_values(shapes, by_name)
        for spec in inputs:
            if spec.name not in shapes:
                shapes[spec.name] = _fill_from_axes(spec, axis_values, where)
    else:
        rng = _parse_range(text, where)
        axis_names = model_axis_names(inputs)
        if len(rng[0]) == len(axis_names):
            values = {
                name: (rng[0][k], rng[1][k], rng[2][k]) for k, name in enumerate(axis_names)
            }
            for spec in inputs:
                shapes[spec.name] = _fill_from_axes(spec, values, where)
        elif all(len(rng[0]) == s.rank for s in inputs):
            for spec in inputs:
                shapes[spec.name] = ShapeRange(*rng)
        else:
            raise ProfileError(
                f"{where}: gives {len(rng[0])} dimension(s) but the model's dynamic axes are "
                f"({', '.join(axis_names)}); give one size per axis, e.g. "
                + ":".join("x".join(["1"] * len(axis_names)) for _ in range(3))
            )
    profile = ShapeProfile({s.name: shapes[s.name] for s in inputs})
    validate_profile(profile, inputs, where)
    return profile


def _axis_values(
    shapes: Mapping[str, ShapeRange], by_name: Mapping[str, TensorSpec]
) -> dict[str, tuple[int, int, int]]:
    values: dict[str, tuple[int, int, int]] = {}
    for name, r in shapes.items():
        for i, axis in enumerate(by_name[name].axes):
            if isinstance(axis, str) and i < len(r.min):
                values.setdefault(axis, (r.min[i], r.opt[i], r.max[i]))
    return values


def validate_profile(profile: ShapeProfile, inputs: Sequence[TensorSpec], where: str) -> None:
    """Check sizes are positive, min <= opt <= max, ranks and static dims match, and inputs
    sharing an axis name agree on it. Errors name the input and dimension."""
    seen_axes: dict[str, tuple[str, tuple[int, int, int]]] = {}
    for spec in inputs:
        if spec.name not in profile.shapes:
            raise ProfileError(f"{where}: no shape for input '{spec.name}'")
        r = profile.shapes[spec.name]
        for which in CORNERS:
            if len(r.corner(which)) != spec.rank:
                raise ProfileError(
                    f"{where}: input '{spec.name}' {which} shape has rank "
                    f"{len(r.corner(which))}, the model's is {spec.rank} {_axes_str(spec)}"
                )
        for d, axis in enumerate(spec.axes):
            label = f"input '{spec.name}' dimension {d} ({axis})"
            lo, mid, hi = r.min[d], r.opt[d], r.max[d]
            if min(lo, mid, hi) <= 0:
                raise ProfileError(f"{where}: {label} must be positive, got {lo}:{mid}:{hi}")
            if not lo <= mid <= hi:
                raise ProfileError(
                    f"{where}: {label} needs min <= opt <= max, got {lo}:{mid}:{hi}"
                )
            if isinstance(axis, int) and (lo, mid, hi) != (axis, axis, axis):
                raise ProfileError(
                    f"{where}: {label} is static in the model (size {axis}), got {lo}:{mid}:{hi}"
                )
            if isinstance(axis, str):
                if axis in seen_axes and seen_axes[axis][1] != (lo, mid, hi):
                    other, vals = seen_axes[axis]
                    raise ProfileError(
                        f"{where}: {label} is {lo}:{mid}:{hi} but input '{other}' has axis "
                        f"'{axis}' as {vals[0]}:{vals[1]}:{vals[2]}; inputs sharing an axis "
                        "must agree"
                    )
                seen_axes.setdefault(axis, (spec.name, (lo, mid, hi)))


def parse_profiles(texts: Sequence[str], inputs: Sequence[TensorSpec]) -> list[ShapeProfile]:
    return [parse_profile(t, inputs) for t in texts]


def check_profile_list(texts: Sequence[str], profiles: Sequence[ShapeProfile]) -> list[str]:
    """Refuse a profile given twice (two identical optimization profiles); notes for a
    profile given as one shape (min = opt = max: the model takes only that shape)."""
    notes: list[str] = []
    for index, (text, profile) in enumerate(zip(texts, profiles, strict=True)):
        earlier = next((t for t, p in zip(texts[:index], profiles[:index], strict=True)
                        if p == profile), None)
        if earlier is not None:
            same = "is given twice" if earlier.strip() == text.strip() \
                else f"is the same profile as {_quoted(earlier.strip())}"
            raise ProfileError(f"profile {_quoted(text.strip())} {same}; each --profile "
                               "must be a different shape range")
        if ":" not in text:
            notes.append(
                f"--profile {text.strip()} is one shape (min = opt = max): the model takes "
                f"only that shape, max_batch_size {profile.axis_range(0)[2]}; give "
                "MIN:OPT:MAX for a range of shapes")
    return notes
