"""JSON values: ``JsonValue``/``JsonObject``, the one type of free-form JSON and YAML data
(report.json's records, stage fingerprints, a recipe's ``config:``), and their checked reading:
a dataclass record (``record_from_json``) or one field of a known type (``json_text``,
``json_number``, ``json_object``, ``json_list``), each a ``ValueError`` that names the field
of a malformed file. ``trtpack.report`` re-exports the two types."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import MISSING, fields
from types import UnionType
from typing import (
    Any,
    Literal,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from typing_extensions import TypeAliasType

JsonValue = TypeAliasType(
    "JsonValue",
    "str | int | float | bool | Sequence[JsonValue] | Mapping[str, JsonValue] | None")
"""A value JSON (and YAML's safe subset) holds: report.json's records, stage fingerprints, a
recipe's ``config:`` (a named recursive alias, so pydantic validates it too)."""

JsonObject = dict[str, JsonValue]
"""A JSON object as trtpack builds one (a report record, a fingerprint)."""

Record = TypeVar("Record")


def json_kind(value: object) -> str:
    """The JSON name of a parsed value's type, for messages: object, array, string ..."""
    if value is None:
        return "null"
    return {bool: "true/false", int: "a number", float: "a number", str: "a string",
            list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def json_type_matches(value: object, hint: object) -> bool:
    """Whether a parsed JSON value fits a field's type hint at the top level (``str``,
    ``int``, ``float``, ``bool``, a ``Literal``, ``list[...]``, ``dict[...]``, a
    ``TypedDict``, ``JsonValue``, ``Any``, ``X | None``)."""
    if hint is Any or hint is JsonValue:
        return True
    origin = get_origin(hint)
    if origin in (Union, UnionType):
        return any(json_type_matches(value, h) for h in get_args(hint))
    if origin is Literal:
        return value in get_args(hint)
    kind = origin or hint
    if kind is type(None):
        return value is None
    if kind is float:
        return type(value) in (int, float)
    if kind is int:
        return type(value) is int
    if is_typeddict(kind):
        return isinstance(value, dict)
    return isinstance(kind, type) and isinstance(value, kind)


def record_from_json(cls: type[Record], data: object, where: str) -> Record:
    """The dataclass ``cls`` from ``data`` (a parsed JSON object), each field checked against
    its type at the top level; a ``ValueError`` naming ``where`` and the field when one is
    missing or of another JSON type (unknown fields are ignored: a newer trtpack's)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} is {json_kind(data)}, expected an object")
    hints = get_type_hints(cls)
    values: dict[str, object] = {}
    for f in fields(cls):  # type: ignore[arg-type]  # cls is a dataclass by contract
        if f.name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ValueError(f"{where}: field '{f.name}' is missing")
            continue
        if not json_type_matches(data[f.name], hints[f.name]):
            value = data[f.name]
            shown = f" ({str(value)[:40]!r})" if isinstance(value, str | int | float) else ""
            raise ValueError(f"{where}: field '{f.name}' is {json_kind(value)}{shown}, "
                             f"expected {_hint_text(hints[f.name])}")
        values[f.name] = data[f.name]
    return cls(**values)


def records_from_json(cls: type[Record], values: object, where: str) -> list[Record]:
    """A JSON array of ``cls`` records (null: none), each read by ``record_from_json`` and
    named ``where[i]`` in an error."""
    if values is not None and not isinstance(values, list):
        raise ValueError(f"{where} is {json_kind(values)}, expected an array")
    return [record_from_json(cls, value, f"{where}[{i}]") for i, value in enumerate(values or [])]


def _hint_text(hint: object) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("NoneType", "None")


def json_object(value: JsonValue, where: str) -> Mapping[str, JsonValue]:
    """``value`` as a JSON object (null: an empty one); a ``ValueError`` naming ``where``
    when it is something else."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} is {json_kind(value)}, expected an object")
    return value


def json_list(value: JsonValue, where: str) -> Sequence[JsonValue]:
    """``value`` as a JSON array (null: an empty one); a ``ValueError`` naming ``where``."""
    if value is None:
        return []
    if isinstance(value, str | Mapping) or not isinstance(value, Sequence):
        raise ValueError(f"{where} is {json_kind(value)}, expected an array")
    return value


def json_number(value: JsonValue, where: str) -> float | None:
    """``value`` as a number (null: None); a ``ValueError`` naming ``where``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where} is {json_kind(value)}, expected a number")
    return float(value)


def json_text(value: JsonValue, where: str) -> str:
    """``value`` as a string (null: ""); a ``ValueError`` naming ``where``."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{where} is {json_kind(value)}, expected a string")
    return value


