"""Nothing reused unverified: a cache entry whose file was changed or truncated is discarded
with one warning naming it, its stage runs again, and the build is byte-identical to a clean
one; ``trtpack cache info|verify|prune``."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import CliResult, run_cli
from trtpack.pipeline.cache import StageCache

BUILD = ("build", "tiny-bert", "--random-weights", "--target", "cpu",
         "--profile", "1x4:2x8:4x16")
MODEL = Path("model_repository") / "tiny-bert"


def build(out: Path, cache: Path, *extra: str) -> CliResult:
    return run_cli(*BUILD, "--out", str(out), "--cache-dir", str(cache), *extra)


def served_files(out: Path) -> dict[str, str]:
    """sha256 of the served model's files and config.pbtxt."""
    files = sorted(p for p in (out / MODEL).rglob("*") if p.is_file())
    assert any(p.name == "model.onnx.data" for p in files)
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@dataclass(frozen=True)
class CleanBuild:
    served: dict[str, str]  # served_files() of a build that reused nothing
    cache: Path  # the cache it filled (read only: each test damages a copy of its own)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> CleanBuild:
    """The build in an empty cache, once for the module: nothing reused (the reference a
    rebuild must match byte for byte), and the four entries it stored."""
    folder = tmp_path_factory.mktemp("clean")
    result = build(folder / "out", folder / "cache")
    assert result.exit_code == 0, result.output
    return CleanBuild(served_files(folder / "out"), folder / "cache")


def cache_of_its_own(clean: CleanBuild, tmp_path: Path) -> Path:
    """A copy of the clean build's cache (files copied, not linked: what a test damages
    stays its own), which the test's first build reuses whole."""
    cache = tmp_path / "cache"
    shutil.copytree(clean.cache, cache)
    return cache


def entry_file(cache: Path, stage: str, name: str) -> Path:
    (entry,) = [e for e in StageCache(cache).entries() if e.stage == stage]
    return entry.path / "files" / name


def flip_middle(path: Path) -> None:
    """Invert 4 KiB in the middle of the file, in place (as a stray tool would)."""
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        block = f.read(4096)
        f.seek(path.stat().st_size // 2)
        f.write(bytes(b ^ 0xFF for b in block))


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 3)


@pytest.mark.parametrize(("stage", "name", "harm"), [
    ("export", "model.onnx.data", flip_middle),
    ("simplify", "model.onnx.data", truncate),
], ids=["damaged-export", "truncated-simplify"])
def test_a_damaged_entry_is_discarded_and_the_rebuild_is_byte_identical(
        tmp_path: Path, clean: CleanBuild, stage: str, name: str, harm) -> None:  # type: ignore[no-untyped-def]
    cache, out = cache_of_its_own(clean, tmp_path), tmp_path / "out"
    assert build(out, cache).exit_code == 0
    harmed = entry_file(cache, stage, name)
    harm(harmed)
    entry = harmed.parent.parent

    again = build(out, cache)
    assert again.exit_code == 0, again.output
    warnings = [line for line in again.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, again.stderr
    assert str(entry) in warnings[0] and name in warnings[0], warnings[0]
    assert f"discarded, {stage} ran again" in warnings[0]
    assert served_files(out) == clean.served
    # the stage ran again and stored a sound entry in its place
    assert StageCache(cache).verify() == []
    assert entry_file(cache, stage, name).read_bytes() != b""


def test_cache_verify_discards_damaged_entries_and_info_prune_report(
        tmp_path: Path, clean: CleanBuild) -> None:
    cache, out = cache_of_its_own(clean, tmp_path), tmp_path / "out"
    assert build(out, cache).exit_code == 0
    info = run_cli("cache", "info", "--cache-dir", str(cache))
    assert info.exit_code == 0 and "4 entries" in info.stdout, info.output
    harmed = entry_file(cache, "export", "model.onnx.data")
    flip_middle(harmed)
    checked = run_cli("cache", "verify", "--cache-dir", str(cache))
    assert checked.exit_code == 0, checked.output
    assert "3 of 4 entries intact, 1 discarded" in checked.stdout
    assert str(harmed.parent.parent) in checked.stderr and "content changed" in checked.stderr
    assert not harmed.parent.parent.exists()
    # an entry no build used for two days goes with --older-than 1d; the others stay
    (old,) = [e for e in StageCache(cache).entries() if e.stage == "verify"]
    two_days_ago = time.time() - 2 * 86400
    os.utime(old.path / "trtpack-stage.json", (two_days_ago, two_days_ago))
    pruned = run_cli("cache", "prune", "--older-than", "1d", "--cache-dir", str(cache))
    assert pruned.exit_code == 0 and "removed 1 entries" in pruned.stdout, pruned.output
    assert sorted(e.stage for e in StageCache(cache).entries()) == ["cpu_model", "simplify"]
    bad = run_cli("cache", "prune", "--older-than", "soon", "--cache-dir", str(cache))
    assert bad.exit_code == 2 and "--older-than" in bad.stderr
    assert run_cli("cache", "prune", "--cache-dir", str(cache)).exit_code == 2  # asks --yes
    assert run_cli("cache", "prune", "--yes", "--cache-dir", str(cache)).exit_code == 0
    assert StageCache(cache).entries() == []


def test_a_reuse_hashes_only_files_written_since_their_last_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit test of the check's timing (bert-large's 2.7 GB of reused weights are not hashed
    again on every rebuild): a file whose inode, size and mtime are those of its last check
    (the store's, or a reuse's), and older than it, is not hashed again; a file written just
    before it was stored is; a write moves the mtime and it is; a damage that hid its mtime
    is still found by ``trtpack cache verify``, which hashes everything."""
    from trtpack.pipeline import cache as stage_cache

    src = tmp_path / "src"
    src.mkdir()
    (src / "model.onnx.data").write_bytes(os.urandom(1 << 20))
    old = time.time() - 60
    os.utime(src / "model.onnx.data", (old, old))  # written a minute ago
    cache = StageCache(tmp_path / "cache")
    cache.store("export", "k", src, {"artifacts": {}})
    hashed: list[str] = []
    real_hash = stage_cache.content_hash
    monkeypatch.setattr(stage_cache, "content_hash",
                        lambda path, mapped=True: hashed.append(path.name) or real_hash(path))

    assert cache.load("export", "k", tmp_path / "b1").meta is not None
    assert hashed == []  # unwritten since the store hashed it: vouched for by its stat
    assert cache.load("export", "k", tmp_path / "b2").meta is not None
    assert hashed == []

    fresh = tmp_path / "fresh"  # written just now: too recent to vouch for
    fresh.mkdir()
    (fresh / "model.onnx.data").write_bytes(os.urandom(1 << 20))
    cache.store("export", "new", fresh, {"artifacts": {}})
    hashed.clear()  # the store hashed it
    assert cache.load("export", "new", tmp_path / "n1").meta is not None
    assert hashed == ["model.onnx.data"]
    hashed.clear()

    stored = tmp_path / "cache" / "stages" / "export" / "k" / "files" / "model.onnx.data"
    with open(stored, "r+b") as f:  # an in-place write: the mtime moves
        f.seek(4096)
        f.write(b"\0" * 4096)
    loaded = cache.load("export", "k", tmp_path / "b3")
    assert loaded.meta is None and "content changed" in (loaded.discarded or "")
    assert hashed == ["model.onnx.data"]

    # a damage that restored the mtime passes a reuse, never `cache verify`
    cache.store("export", "k2", src, {"artifacts": {}})
    stored = tmp_path / "cache" / "stages" / "export" / "k2" / "files" / "model.onnx.data"
    st = stored.stat()
    with open(stored, "r+b") as f:
        f.write(b"\xff" * 16)
    os.utime(stored, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert [p.split(": ")[1] for p in cache.verify()] == ["model.onnx.data's content changed"]
