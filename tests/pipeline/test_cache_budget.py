"""The stage cache's size budget (issue 46): entries go least recently used first, counting
only the bytes the cache alone holds (an entry hard-linked into a build folder frees nothing
and stays), and a build says what it removed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import trtpack
from trtpack.errors import UserInputError
from trtpack.pipeline.cache import EntryInfo, StageCache
from trtpack.pipeline.cache_budget import least_recently_used, parse_size

BUILD = ("build", "tiny-bert", "--random-weights", "--target", "cpu", "--precision", "fp32")


def _entry(key: str, used: float, own: int) -> EntryInfo:
    return EntryInfo("export", key, Path(key), 1000, used, own)


def test_the_least_recently_used_entries_that_free_bytes_go_first() -> None:
    entries = [_entry("new", 30.0, 400), _entry("linked", 10.0, 0),
               _entry("old", 20.0, 500), _entry("oldest", 5.0, 300)]
    assert [e.key for e in least_recently_used(entries, 1200)] == []
    assert [e.key for e in least_recently_used(entries, 900)] == ["oldest"]
    assert [e.key for e in least_recently_used(entries, 500)] == ["oldest", "old"]
    assert [e.key for e in least_recently_used(entries, 0)] == ["oldest", "old", "new"]
    assert parse_size("500MB") == 500 * 2**20 and parse_size("1.5gb") == 3 * 2**29
    assert parse_size("0") == 0
    with pytest.raises(UserInputError):
        parse_size("lots")


def test_a_build_keeps_its_cache_within_the_budget(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = trtpack(*BUILD, "--profile", "1x4:2x8:4x16", "--out", str(tmp_path / "a"),
                    "--cache-dir", str(cache))
    assert first.returncode == 0, first.stderr
    kept_first = {e.key for e in StageCache(cache).entries()}
    assert all(e.own_bytes == 0 for e in StageCache(cache).entries())  # linked into a/
    shutil.rmtree(tmp_path / "a")  # now the cache alone holds them
    assert all(e.own_bytes > 0 for e in StageCache(cache).entries())
    second = trtpack(*BUILD, "--profile", "2x8:2x8:4x16", "--out", str(tmp_path / "b"),
                     "--cache-dir", str(cache), env={"TRTPACK_CACHE_BUDGET": "1KB"})
    assert second.returncode == 0, second.stderr
    said = " ".join(second.stderr.split())
    assert "over its budget of 0.0 MB (TRTPACK_CACHE_BUDGET): removed its" in said, said
    left = StageCache(cache).entries()
    assert left and not {e.key for e in left} & kept_first  # only b's entries stay
    assert all(e.own_bytes == 0 for e in left)
    again = trtpack(*BUILD, "--profile", "2x8:2x8:4x16", "--out", str(tmp_path / "b"),
                    "--cache-dir", str(cache), "--json", env={"TRTPACK_CACHE_BUDGET": "1KB"})
    assert again.returncode == 0 and "over its budget" not in again.stderr
    bad = trtpack(*BUILD, "--out", str(tmp_path / "c"), "--cache-dir", str(cache),
                  env={"TRTPACK_CACHE_BUDGET": "lots"})
    assert bad.returncode == 2 and "TRTPACK_CACHE_BUDGET='lots'" in bad.stderr
    assert not (tmp_path / "c").exists()
