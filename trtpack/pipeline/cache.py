"""The stage cache. A stage's key hashes its name, its fingerprint (the options it depends
on), the key of the stage before it, the tool versions and a digest of trtpack's own code.
A finished stage folder is hard-linked into ``CACHE/stages/<stage>/<key>/`` through a
temporary name and a rename, so an interrupted build never leaves anything that could be
taken for a result; a hit hard-links it back (gigabytes of weights cost nothing to reuse)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import trtpack
from trtpack import __version__
from trtpack.onnx_files import link_tree

META = "trtpack-stage.json"


def source_digest() -> str:
    """sha256 of trtpack's own Python files: a changed stage never reuses an old result,
    whatever ``__version__`` says."""
    digest = hashlib.sha256()
    root = Path(trtpack.__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def tool_versions() -> dict[str, str | None]:
    """trtpack's version and code digest, and every package a build report records."""
    from trtpack.machine import recorded_versions

    return {"trtpack": __version__, "trtpack_source": source_digest(), **recorded_versions()}


def stage_key(stage: str, fingerprint: dict[str, Any], upstream: str,
              versions: dict[str, str | None]) -> str:
    payload = json.dumps(
        {"stage": stage, "fingerprint": fingerprint, "upstream": upstream,
         "versions": versions},
        sort_keys=True, default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


class StageCache:
    """Finished stage folders by key; writes go through a temporary name and a rename."""

    def __init__(self, root: Path) -> None:
        self.root = root / "stages"

    def _entry(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def has(self, stage: str, key: str) -> bool:
        return (self._entry(stage, key) / META).is_file()

    def load(self, stage: str, key: str, dst: Path) -> dict[str, Any] | None:
        entry = self._entry(stage, key)
        meta_path = entry / META
        if not meta_path.is_file():
            return None
        try:
            meta: dict[str, Any] = json.loads(meta_path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        link_tree(entry / "files", dst)
        return meta

    def store(self, stage: str, key: str, src: Path, meta: dict[str, Any]) -> None:
        entry = self._entry(stage, key)
        if entry.exists():
            return
        tmp = entry.with_name(f"{key}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
            link_tree(src, tmp / "files")
            for f in (tmp / "files").rglob("*"):
                if f.is_file():  # shared by hard links with build folders: never edit in place
                    f.chmod(0o444)
            (tmp / META).write_text(json.dumps(meta, default=str))
            tmp.rename(entry)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)


def relative_artifacts(artifacts: dict[str, Path], stage_dir: Path) -> dict[str, str]:
    rel: dict[str, str] = {}
    for name, path in artifacts.items():
        if path.is_relative_to(stage_dir):
            rel[name] = str(path.relative_to(stage_dir))
    return rel
