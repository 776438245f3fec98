"""The stage cache. A stage's key hashes its name, its fingerprint (the options it depends
on), the key of the stage before it, and the code it runs with the versions of the packages
that code uses (``pipeline.keys``).
A finished stage folder is hard-linked into ``CACHE/stages/<stage>/<key>/`` through a
temporary name and a rename, so an interrupted build never leaves anything that could be
taken for a result; a hit hard-links it back (gigabytes of weights cost nothing to reuse).

Why hard links, not copies: a bert-large rebuild would copy 3-4 GB (seconds, and the disk
twice over); reflinks exist only on btrfs/XFS. The price is that a file under OUT and its
cache entry are one file, so damage to one is damage to the other: entries are read-only,
and every reuse checks each file it links against the size and BLAKE3 recorded when it was
stored (a file unwritten since its last check, by its inode, size and mtime, is not hashed
again: ``Checked``); a damaged entry is discarded and its stage runs again. Stages that
load weights with onnx copy them first (onnx refuses external data with several links)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import trtpack
from trtpack import __version__
from trtpack.json_values import JsonObject, JsonValue
from trtpack.onnx_tools.files import link_tree
from trtpack.out_files import pid_is_live_build
from trtpack.pipeline.cache_records import entry_files
from trtpack.stages.artifacts import Artifacts

META = "trtpack-stage.json"
CHECKED = "checked.json"  # when the entry's files were last hashed (``Checked``)


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
    from trtpack.machine.packages import recorded_versions

    return {"trtpack": __version__, "trtpack_source": source_digest(), **recorded_versions()}


KEY_FORMAT = 2  # what a key holds (2: each stage's own code and packages, ``keys``)


def stage_key(stage: str, fingerprint: JsonObject, upstream: str,
              dependencies: Mapping[str, object]) -> str:
    """The entry's name: the stage, its options (``fingerprint``), the key of the stage
    before it, and what its code depends on (``keys.stage_dependencies``)."""
    payload = json.dumps(
        {"format": KEY_FORMAT, "stage": stage, "fingerprint": fingerprint,
         "upstream": upstream, "dependencies": dependencies},
        sort_keys=True, default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


HASH_CHUNK = 4 * 2**20  # a larger buffer is no faster, and counts in the build's memory


def content_hash(path: Path, mapped: bool = True) -> str:
    """BLAKE3 of a file on all cores (a few GB/s: bert-large's weights in well under a second
    when they are in the page cache). ``mapped``: read through mmap, the fastest, but the
    file's pages count in this process's resident memory while it is hashed; else in 4 MB
    chunks (a little slower), for hashing beside a running stage, whose peak memory is
    measured with this process's."""
    import blake3

    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    if not path.stat().st_size:
        return hasher.hexdigest()
    if mapped:
        hasher.update_mmap(str(path))
        return hasher.hexdigest()
    chunk = bytearray(HASH_CHUNK)
    view = memoryview(chunk)
    with open(path, "rb") as f:
        while n := f.readinto(chunk):
            hasher.update(view[:n])
    return hasher.hexdigest()


def file_hashes(root: Path, mapped: bool = True) -> dict[str, list[int | str]]:
    """``{relative path: [size, blake3]}`` of every file under ``root``."""
    return {str(f.relative_to(root)): [f.stat().st_size, content_hash(f, mapped)]
            for f in sorted(root.rglob("*")) if f.is_file()}


def damage(root: Path, recorded: Mapping[str, Sequence[int | str]], *, contents: bool = True,
           unchanged: Callable[[str, os.stat_result], bool] = lambda rel, st: False
           ) -> str | None:
    """What differs between the files under ``root`` and ``recorded`` (the set of files and
    their sizes first, then their contents, except those ``unchanged`` vouches for), or None
    when they match."""
    present = {str(f.relative_to(root)): f for f in root.rglob("*") if f.is_file()}
    missing = sorted(set(recorded) - set(present))
    if missing:
        return f"{missing[0]} is missing"
    extra = sorted(set(present) - set(recorded))
    if extra:
        return f"{extra[0]} was not in it when stored"
    for rel, (size, _) in recorded.items():
        if present[rel].stat().st_size != size:
            return f"{rel} has {present[rel].stat().st_size} bytes, not {size} (truncated?)"
    if contents:
        for rel, (_, digest) in recorded.items():
            if not unchanged(rel, present[rel].stat()) and content_hash(present[rel]) != digest:
                return f"{rel}'s content changed"
    return None


def stat_key(st: os.stat_result) -> list[int]:
    return [st.st_ino, st.st_size, st.st_mtime_ns]


class Checked:
    """When an entry's files were last hashed and found intact, with their inode, size and
    mtime then (``CHECKED`` in the entry). A file whose stat is the same, and whose mtime is
    older than that check by more than ``RACY_NS`` (a write in the same instant could keep
    it), is the same file, unwritten since: its hash is not computed again (git's index does
    the same). Every write through the file system moves its mtime; a copy gets a new inode."""

    RACY_NS = 100_000_000  # file timestamps tick every few ms (the kernel's coarse clock)

    def __init__(self, entry: Path) -> None:
        self.path = entry / CHECKED
        try:
            data = json.loads(self.path.read_text())
            self.at = int(data["at"])
            self.files: dict[str, list[int]] = dict(data["files"])
        except (OSError, ValueError, KeyError, TypeError):
            self.at, self.files = 0, {}

    def vouches(self, rel: str, st: os.stat_result) -> bool:
        return self.files.get(rel) == stat_key(st) and st.st_mtime_ns < self.at - self.RACY_NS

    def record(self, root: Path, files: Iterable[str], started_ns: int) -> None:
        """All ``files`` under ``root`` were found intact by hashing that began at
        ``started_ns`` (``time.time_ns()``)."""
        data = {"at": started_ns, "files": {rel: stat_key((root / rel).stat())
                                            for rel in files}}
        if data["files"] == self.files and self.at > 0:
            return
        tmp = self.path.with_name(f"{CHECKED}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.path)
        except OSError:  # a read-only or full cache: checked again next time, nothing left
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)


@dataclass
class Loaded:
    """A cache lookup: the entry's metadata (a hit), or why the entry was discarded."""

    meta: JsonObject | None
    discarded: str | None = None  # "CACHE/stages/export/KEY: model.onnx.data's content changed"


@dataclass
class EntryInfo:
    """One cache entry, as ``trtpack cache info`` lists it."""

    stage: str
    key: str
    path: Path
    bytes: int
    modified: float  # its last use (``StageCache.touch``)
    own_bytes: int = 0  # of files no build folder links to: what removing it frees


class StageCache:
    """Finished stage folders by key, each with the size and BLAKE3 of every file. Writes go
    through a temporary name and a rename, so a half-written entry is never seen; a reuse
    checks every file before it is used, and a damaged entry is discarded (renamed away, then
    removed: a build reading it at that moment keeps its links)."""

    def __init__(self, root: Path) -> None:
        self.base = root
        self.root = root / "stages"

    def _entry(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def has(self, stage: str, key: str) -> bool:
        return (self._entry(stage, key) / META).is_file()

    def holds_any(self, stage: str) -> bool:
        """Whether any entry of ``stage`` is stored (one folder listing, no key: the command
        line asks before it has a build plan, ``pipeline.prestart``)."""
        folder = self.root / stage
        with contextlib.suppress(OSError):
            return any("." not in entry.name for entry in folder.iterdir())
        return False

    def load(self, stage: str, key: str, dst: Path) -> Loaded:
        """Link the entry's files into ``dst`` and check them (sizes, then BLAKE3 of the
        linked files themselves, so what is checked is what the build uses)."""
        entry = self._entry(stage, key)
        if not entry.exists():
            return Loaded(None)
        problem: str | None
        meta: JsonObject | None = None
        try:
            meta = json.loads((entry / META).read_text())
            recorded = meta["files"] if isinstance(meta, dict) else None
            if not isinstance(recorded, dict):
                raise ValueError("no file hashes")
            problem = damage(entry / "files", recorded, contents=False)
            if problem is None:
                link_tree(entry / "files", dst)
                checked = Checked(entry)
                started = time.time_ns()
                problem = damage(dst, recorded, unchanged=checked.vouches)
                if problem is None:
                    checked.record(dst, recorded, started)
        except FileNotFoundError as e:
            if not entry.exists():  # discarded or pruned meanwhile: a miss
                return Loaded(None)
            problem = f"{Path(e.filename or META).name} is missing"
        except (OSError, ValueError, KeyError, TypeError) as e:
            problem = f"{META} unreadable ({type(e).__name__})"
        if problem is None:
            return Loaded(meta)
        for f in list(dst.iterdir()) if dst.is_dir() else []:
            if f.is_dir():
                shutil.rmtree(f)
            else:
                f.unlink()
        self.discard(entry)
        return Loaded(None, f"{entry}: {problem}")

    def discard(self, entry: Path) -> None:
        """Rename ``entry`` away, then remove it."""
        trash = entry.with_name(f"{entry.name}.discarded-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            entry.rename(trash)
        except OSError:
            return  # already gone
        shutil.rmtree(trash, ignore_errors=True)

    def artifact_names(self, stage: str, key: str) -> frozenset[str] | None:
        """The artifacts (``Artifacts`` fields) the entry holds, from its metadata (None:
        unreadable)."""
        try:
            return frozenset(json.loads((self._entry(stage, key) / META).read_text())
                             ["artifacts"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def entry_path(self, stage: str, key: str) -> Path:
        return self._entry(stage, key)

    def temporary_entry(self, stage: str, key: str) -> Path:
        """A new folder beside where the entry goes, under a temporary name (what an
        interrupted build leaves there is never a hit, and ``prune`` removes it)."""
        tmp = self._entry(stage, key).with_name(
            f"{key}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        tmp.mkdir(parents=True)
        return tmp

    def store(self, stage: str, key: str, src: Path, meta: JsonObject) -> None:
        entry = self._entry(stage, key)
        if entry.exists():
            return
        tmp: Path | None = None
        try:
            tmp = self.temporary_entry(stage, key)
            link_tree(src, tmp / "files")
            started = time.time_ns()
            files = file_hashes(tmp / "files", mapped=False)  # beside a running stage
            self._seal(tmp, entry, {**meta, "files": files}, started)
        except OSError:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    def adopt(self, stage: str, key: str, tmp: Path, meta: Mapping[str, JsonValue]
              ) -> str | None:
        """Make ``tmp`` (from ``temporary_entry``, its files under ``tmp/files``, e.g.
        downloaded from another machine) the entry of ``key``, once its files match the
        sizes and BLAKE3 ``meta["files"]`` records; else what differs (nothing is stored).

        The files are this process's alone, all written: their mtimes are set back before
        they are hashed, so the entry's ``Checked`` record vouches for them at once (a file
        written in the last ``Checked.RACY_NS`` would be hashed again by the first ``load``,
        a second pass over what was just checked). A write after this moves the mtime to now,
        which the record does not vouch for."""
        started = time.time_ns()
        back = started - 2 * Checked.RACY_NS
        for f in (tmp / "files").rglob("*"):
            if f.is_file():
                with contextlib.suppress(OSError):  # then hashed again by the first load
                    os.utime(f, ns=(back, back))
        problem = damage(tmp / "files", entry_files(meta, f"{stage}'s entry"))
        if problem is None:
            try:
                self._seal(tmp, self._entry(stage, key), dict(meta), started)
            except OSError as e:
                return f"it could not be stored here ({type(e).__name__})"
        return problem

    @staticmethod
    def _seal(tmp: Path, entry: Path, meta: Mapping[str, JsonValue], checked_at: int) -> None:
        """Finish the entry in ``tmp`` (its files hashed from ``checked_at`` on) and rename
        it into place: its files read-only, its metadata written last."""
        for f in (tmp / "files").rglob("*"):
            if f.is_file():  # shared by hard links with build folders: never edit in place
                f.chmod(0o444)
        (tmp / META).write_text(json.dumps(meta, default=str))
        Checked(tmp).record(tmp / "files", entry_files(meta, str(entry)), checked_at)
        try:
            tmp.rename(entry)
        except OSError:  # another build stored the same key first: it stays
            if not (entry / META).is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)

    def entries(self) -> list[EntryInfo]:
        """Every finished entry (temporary and discarded folders left out)."""
        found: list[EntryInfo] = []
        if not self.root.is_dir():
            return found
        for stage_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for entry in sorted(stage_dir.iterdir()):
                if "." in entry.name or not entry.is_dir():
                    continue
                size = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
                meta = entry / META
                modified = (meta if meta.is_file() else entry).stat().st_mtime
                # its stage's files no build folder links to (its records beside them are
                # the cache's own, but too small to count: removing them frees nothing)
                own = sum(st.st_size for st in (f.stat() for f in (entry / "files").rglob("*")
                                                if f.is_file()) if st.st_nlink == 1)
                found.append(EntryInfo(stage_dir.name, entry.name, entry, size, modified,
                                       own))
        return found

    def verify(self) -> list[str]:
        """Check every entry's files; discard the damaged ones. What was discarded, and why."""
        problems = []
        for info in self.entries():
            try:
                meta = json.loads((info.path / META).read_text())
                problem = damage(info.path / "files", meta["files"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                problem = f"{META} unreadable ({type(e).__name__})"
            if problem is not None:
                self.discard(info.path)
                problems.append(f"{info.path}: {problem}")
        return problems

    def prune(self, older_than_seconds: float | None) -> list[EntryInfo]:
        """Remove the entries last used more than ``older_than_seconds`` ago (all of them
        with None), and what interrupted builds left; the removed entries."""
        now = time.time()
        removed = []
        for info in self.entries():
            if older_than_seconds is None or now - info.modified > older_than_seconds:
                self.discard(info.path)
                removed.append(info)
        if self.root.is_dir():
            for stage_dir in self.root.iterdir():
                for leftover in stage_dir.glob("*.tmp-*"):
                    pid = leftover.name.split(".tmp-")[1].split("-")[0]
                    if pid.isdigit() and not pid_is_live_build(int(pid)):
                        shutil.rmtree(leftover, ignore_errors=True)
        return removed

    def touch(self, stage: str, key: str) -> None:
        """Mark an entry as used now (``prune --older-than`` keeps what builds still use)."""
        with contextlib.suppress(OSError):
            os.utime(self._entry(stage, key) / META)


def relative_artifacts(artifacts: Artifacts, stage_dir: Path) -> dict[str, str]:
    """A stage's artifacts as its cache entry records them: by name, inside its folder."""
    rel: dict[str, str] = {}
    for name, path in artifacts.named().items():
        if path.is_relative_to(stage_dir):
            rel[name] = str(path.relative_to(stage_dir))
    return rel
