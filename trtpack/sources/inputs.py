"""``--input`` (recipe key ``inputs:``): what a model's input is where it cannot be read.

    NAME=DTYPE[DIM,...]          a tensor: its dtype and dims (a name is a dynamic dim)
    NAME=VALUE                   a constant (a non-tensor argument, folded into the graph)
    NAME=LOW..HIGH               the range its values are drawn from
    NAME=DTYPE[DIM,...]=VALUE    both

(The smallest form of issue 31's grammar, written to its contract; its helper owns it.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from trtpack.errors import UserInputError
from trtpack.shapes import TensorSpec

DTYPES = ("float32", "float16", "int64", "int32", "uint8", "bool")
_TENSOR = re.compile(r"^([a-z0-9]+)\[([^\]]*)\]$")


@dataclass(frozen=True)
class ValueRule:
    """A constant, or the ``low..high`` range an input's values are drawn from."""

    constant: int | float | bool | str | None = None
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class InputDescription:
    name: str
    spec: TensorSpec | None
    value: ValueRule | None


def _number(text: str) -> int | float | bool | str:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(lowered)
    except ValueError:
        pass
    try:
        return float(lowered)
    except ValueError:
        return text.strip()


def _value(text: str, where: str) -> ValueRule:
    if ".." in text:
        low, _, high = text.partition("..")
        a, b = _number(low), _number(high)
        if not isinstance(a, int | float) or not isinstance(b, int | float) or a > b:
            raise UserInputError(f"{where}: '{text}' is not a range LOW..HIGH, e.g. 0..255")
        return ValueRule(low=float(a), high=float(b))
    return ValueRule(constant=_number(text))


def parse_input_option(text: str) -> InputDescription:
    """One ``--input`` value."""
    where = f"--input '{text}'"
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise UserInputError(f"{where}: expected NAME=DTYPE[DIM,...] or NAME=VALUE, e.g. "
                             "--input x=float32[batch,16]")
    rest = rest.strip()
    tensor_text, sep2, value_text = rest.partition("=") if "[" in rest else ("", "", rest)
    spec = None
    if tensor_text:
        match = _TENSOR.match(tensor_text.strip())
        if match is None:
            raise UserInputError(f"{where}: '{tensor_text}' is not DTYPE[DIM,...]")
        dtype, dims_text = match.groups()
        if dtype not in DTYPES:
            raise UserInputError(f"{where}: unknown dtype '{dtype}'; choose one of "
                                 f"{', '.join(DTYPES)}")
        axes: list[str | int] = []
        for dim in (d.strip() for d in dims_text.split(",") if d.strip()):
            if dim.isdigit() and int(dim) > 0:
                axes.append(int(dim))
            elif dim.isidentifier():
                axes.append(dim)
            else:
                raise UserInputError(f"{where}: dim '{dim}' is neither a size nor a name")
        spec = TensorSpec(name, dtype, tuple(axes))
    value = _value(value_text, where) if (value_text.strip() or not spec) else None
    if value is not None and value.constant == "":
        raise UserInputError(f"{where}: no value after '='")
    return InputDescription(name, spec, value if sep2 or not spec else None)


def parse_input_options(texts: Sequence[str]) -> list[InputDescription]:
    descriptions = [parse_input_option(t) for t in texts]
    names = [d.name for d in descriptions]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise UserInputError(f"--input {twice} is given twice")
    return descriptions
