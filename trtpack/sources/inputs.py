"""The one input grammar: what an input is (dtype and axes) and which values it takes (a
constant or a range), as ``--input`` gives it on the command line and a recipe's ``inputs:``
entries give it in a file.

Forms (NAME is the input's name, everything after its first ``=`` is the rest):

- ``NAME=DTYPE[DIM,...]``: a description, e.g. ``input=float32[batch,3,224,224]``; a DIM is
  a static size (``224``) or a symbolic axis name (``batch``); ``[]`` is a scalar;
- ``NAME=VALUE``: a constant, e.g. ``sr=16000``, ``scale=0.5``, ``flag=true``;
- ``NAME=LOW..HIGH``: a range, e.g. ``pixels=0..1``: uniform in [LOW, HIGH], whole numbers
  (both ends included) for an integer input;
- ``NAME=DTYPE[DIM,...]=VALUE`` or ``NAME=DTYPE[DIM,...]=LOW..HIGH``: both.

A constant stays a served input: it is fed in verification and calibration and written into
the perf_analyzer inputs; trtpack never folds it into the model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from trtpack.errors import UserInputError
from trtpack.shapes import Dim, TensorSpec

InputDtype = Literal["float32", "float16", "int64", "int32", "int8", "uint8", "bool"]
"""The input dtypes both ONNX Runtime and Triton take (numpy names)."""
INPUT_DTYPES: tuple[str, ...] = get_args(InputDtype)

INTEGER_DTYPES = frozenset({"int64", "int32", "int8", "uint8"})

Number = int | float | bool

FORMS = ("NAME=DTYPE[DIM,...] (input=float32[batch,3,224,224]), NAME=VALUE (sr=16000), "
         "NAME=LOW..HIGH (pixels=0..1), or both: NAME=DTYPE[DIM,...]=VALUE or "
         "=LOW..HIGH; DTYPE one of " + ", ".join(INPUT_DTYPES) + "; a DIM is a size or an "
         "axis name, [] a scalar")
"""The accepted forms, for help texts and hints."""

_DESCRIPTION = re.compile(r"^\s*([a-z0-9]+)\s*\[([^\]]*)\]\s*(?:=(.*))?$", re.DOTALL)
_AXIS_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INTEGER = re.compile(r"^[+-]?[0-9]+$")
_FLOAT = re.compile(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$")
_BOOLS = {"true": True, "false": False}


@dataclass(frozen=True)
class ValueRule:
    """Which values an input takes: a constant (``constant`` set), or a range ``low..high``
    (uniform in [low, high]; whole numbers, both ends included, for an integer input)."""

    constant: Number | None = None
    low: int | float | None = None
    high: int | float | None = None

    def __post_init__(self) -> None:
        ranged = self.low is not None and self.high is not None
        if (self.constant is None) == (not ranged) or (self.low is None) != (self.high is None):
            raise ValueError("a ValueRule is a constant or a low..high range")
        if ranged and self.low > self.high:  # type: ignore[operator]
            raise ValueError(f"range {self.low}..{self.high}: low is above high")

    @property
    def is_constant(self) -> bool:
        return self.constant is not None

    def __str__(self) -> str:
        if self.constant is not None:
            return _number_text(self.constant)
        return f"{_number_text(self.low)}..{_number_text(self.high)}"  # type: ignore[arg-type]


@dataclass(frozen=True)
class InputDescription:
    """One ``--input``: the input's name, its dtype and axes if given, its values if given."""

    name: str
    spec: TensorSpec | None = None
    value: ValueRule | None = None

    def __str__(self) -> str:
        parts = [self.name]
        if self.spec is not None:
            parts.append(f"{self.spec.dtype}[{','.join(str(a) for a in self.spec.axes)}]")
        if self.value is not None:
            parts.append(str(self.value))
        return "=".join(parts)


def _number_text(value: Number) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value)


def _bad(text: str, where: str, problem: str) -> UserInputError:
    name = text.partition("=")[0].strip()
    named = f"input '{name}'" if name else "an input"
    return UserInputError(f"{where} '{text}' ({named}): {problem}",
                          hint=f"accepted forms: {FORMS}")


def parse_number(text: str) -> Number:
    """``16000`` → int, ``0.5`` / ``1e-3`` → float, ``true`` / ``false`` → bool; else
    ``ValueError``."""
    word = text.strip()
    if word.lower() in _BOOLS:
        return _BOOLS[word.lower()]
    if _INTEGER.match(word):
        return int(word)
    if _FLOAT.match(word) or word.lower() in ("inf", "-inf", "+inf"):
        return float(word)
    raise ValueError(word)


def parse_value_rule(text: str) -> ValueRule:
    """``VALUE`` or ``LOW..HIGH`` as a ``ValueRule``; ``ValueError`` with the reason."""
    low_text, dots, high_text = text.partition("..")
    if not dots:
        return ValueRule(constant=parse_number(text))
    low, high = parse_number(low_text), parse_number(high_text)
    if isinstance(low, bool) or isinstance(high, bool):
        raise ValueError("a range takes numbers, not true/false")
    if low > high:
        raise ValueError(f"the range {text.strip()} runs backwards (LOW above HIGH)")
    return ValueRule(low=low, high=high)


def _parse_axes(text: str) -> tuple[Dim, ...]:
    if not text.strip():
        return ()
    axes: list[Dim] = []
    for part in (p.strip() for p in text.split(",")):
        if _INTEGER.match(part) and int(part) >= 1:
            axes.append(int(part))
        elif _AXIS_NAME.match(part):
            axes.append(part)
        else:
            raise ValueError(f"'{part}' is not a dimension (a size of 1 or more, or an axis "
                             "name such as batch)")
    return tuple(axes)


def value_rule_problem(dtype: str, rule: ValueRule) -> str | None:
    """Why ``rule`` cannot feed an input of ``dtype`` (a fraction for an integer input, a
    range for a bool, a value outside the dtype), or None."""
    import numpy as np

    values = [rule.constant] if rule.constant is not None else [rule.low, rule.high]
    if dtype == "bool":
        if not rule.is_constant or not isinstance(rule.constant, bool | int) \
                or rule.constant not in (0, 1):
            return "a bool input takes true or false"
        return None
    if any(isinstance(v, bool) for v in values):
        return f"true/false is not a value of a {dtype} input"
    if dtype in INTEGER_DTYPES:
        if any(isinstance(v, float) for v in values):
            return f"a {dtype} input takes whole numbers"
        info = np.iinfo(np.dtype(dtype))
        if any(not info.min <= int(v) <= info.max for v in values):  # type: ignore[arg-type]
            return f"a {dtype} input holds {info.min}..{info.max}"
    return None


def parse_input_option(text: str, where: str = "--input") -> InputDescription:
    """One input in the grammar (module docstring); a ``UserInputError`` (exit 2) naming the
    input and the accepted forms when ``text`` is none of them."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise _bad(text, where, "expected NAME=... (the input's name, then '=')")
    if not rest.strip():
        raise _bad(text, where, "nothing after '='")
    spec: TensorSpec | None = None
    value_text: str | None = rest
    described = _DESCRIPTION.match(rest)
    if described is not None:
        dtype, axes_text, value_text = described.groups()
        if dtype not in INPUT_DTYPES:
            raise _bad(text, where, f"unknown dtype '{dtype}'")
        try:
            spec = TensorSpec(name, dtype, _parse_axes(axes_text))
        except ValueError as e:
            raise _bad(text, where, str(e)) from None
        if value_text is not None and not value_text.strip():
            raise _bad(text, where, "nothing after the description's '='")
    elif "[" in rest or rest.strip().lower().startswith(INPUT_DTYPES):
        raise _bad(text, where, f"'{rest.strip()}' is not a description DTYPE[DIM,...]")
    rule: ValueRule | None = None
    if value_text is not None:
        try:
            rule = parse_value_rule(value_text)
        except ValueError as e:
            reason = str(e) if " " in str(e) else f"'{str(e) or value_text}' is not a number"
            raise _bad(text, where, f"{reason}: a value is a number or true/false, a range "
                       "LOW..HIGH") from None
        if spec is not None:
            problem = value_rule_problem(spec.dtype, rule)
            if problem is not None:
                raise _bad(text, where, f"{rule}: {problem}")
    return InputDescription(name, spec, rule)


def parse_input_options(texts: Iterable[str], where: str = "--input"
                        ) -> tuple[InputDescription, ...]:
    """Every ``--input``, in order; a name given twice is an error (exit 2)."""
    descriptions: list[InputDescription] = []
    for text in texts:
        description = parse_input_option(text, where)
        if any(d.name == description.name for d in descriptions):
            raise UserInputError(f"{where}: input '{description.name}' is given twice; give "
                                 "each input once (NAME=DTYPE[DIM,...]=VALUE sets both)")
        descriptions.append(description)
    return tuple(descriptions)
