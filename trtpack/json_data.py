"""JSON data as trtpack writes and reads it: report.json, stage fingerprints, recipe YAML."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

JsonValue: TypeAlias = (str | int | float | bool | Sequence["JsonValue"]
                        | Mapping[str, "JsonValue"] | None)
"""A value that JSON (and so YAML's safe subset) holds: what is written is one of these."""

JsonObject: TypeAlias = dict[str, JsonValue]
"""A JSON object as trtpack builds one (a report record, a fingerprint)."""
