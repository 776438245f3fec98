"""What a stage cache entry's ``meta.json`` records, read and checked: its files
(``entry_files``: relative path -> size and BLAKE3) and what a stage run reads back from it
(``EntryRecord``: the stage's result, artifacts, their records, verification rows)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trtpack.json_values import JsonValue, json_list, json_object, json_text, records_from_json
from trtpack.report import Artifact, StageResult, VerificationRow, stage_from_json


def entry_files(meta: Mapping[str, JsonValue], where: str) -> dict[str, tuple[int, str]]:
    """An entry's ``files`` record (its ``meta.json``): relative path -> (size, BLAKE3),
    checked; a ``ValueError`` naming ``where`` and the file when it is malformed (a path out
    of the entry among them)."""
    files: dict[str, tuple[int, str]] = {}
    for rel, value in json_object(meta.get("files"), f"{where}: files").items():
        record = json_list(value, f"{where}: files.{rel}")
        if len(record) != 2 or type(record[0]) is not int or not isinstance(record[1], str) \
                or Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise ValueError(f"{where}: files.{rel} is not a [size, digest] record of a file "
                             "inside the entry")
        files[rel] = (record[0], record[1])
    return files


@dataclass
class EntryRecord:
    """What a stage run reads back from an entry's ``meta.json`` (``StageCache.store``'s
    ``meta``): the stage's result, its artifacts by ``Artifacts`` field (paths relative to
    the stage folder), their records and the verification rows it made."""

    result: StageResult
    artifacts: dict[str, str]
    records: list[Artifact]
    verification: list[VerificationRow]

    @classmethod
    def from_meta(cls, meta: Mapping[str, JsonValue], where: str) -> EntryRecord:
        """Read and checked: a ``ValueError`` naming ``where`` and the field."""
        return cls(
            stage_from_json(meta.get("result"), f"{where}: result"),
            {name: json_text(rel, f"{where}: artifacts.{name}") for name, rel in
             json_object(meta.get("artifacts"), f"{where}: artifacts").items()},
            records_from_json(Artifact, meta.get("records"), f"{where}: records"),
            records_from_json(VerificationRow, meta.get("verification"),
                              f"{where}: verification"))
