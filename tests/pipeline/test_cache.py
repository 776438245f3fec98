"""The stage cache: a rebuild reuses every stage, a change re-runs only the stages after it,
and nothing half-written is ever taken for a result."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import run_cli
from trtpack.onnx_tools.files import sha256_file
from trtpack.pipeline.cache import StageCache


def _build(out: Path, cache: Path, *extra: str) -> dict[str, dict]:
    # FP16 is checked for a later GPU build (--target cpu serves FP32 and skips it)
    target = ("--target", "g5", "--no-engine") if "fp16" in extra else ("--target", "cpu")
    result = run_cli("build", "tiny-bert", "--random-weights", *target,
                     "--out", str(out), "--cache-dir", str(cache), "--json", *extra)
    assert result.exit_code == 0, result.output
    return {s["name"]: s for s in json.loads(result.stdout)["stages"]}


def _ran(stages: dict[str, dict]) -> list[str]:
    return [n for n, s in stages.items() if s["status"] != "skipped" and not s["cached"]]


@dataclass(frozen=True)
class FirstBuilds:
    """tiny-bert FP32 built twice into a cache of this module's own: the first build into
    ``first_out`` in the empty cache, then the same build again into ``again_out``."""

    cache: Path
    first_out: Path
    first: dict[str, dict]
    again_out: Path
    again: dict[str, dict]


@pytest.fixture(scope="module")
def first_builds(tmp_path_factory: pytest.TempPathFactory) -> FirstBuilds:
    """The two builds every test here starts from (the cache is their subject: not the
    session's), made once for the module; the tests that build more build on top of them."""
    folder = tmp_path_factory.mktemp("cache-test")
    cache, first_out, again_out = folder / "cache", folder / "first", folder / "again"
    first = _build(first_out, cache, "--precision", "fp32")
    again = _build(again_out, cache, "--precision", "fp32")
    return FirstBuilds(cache, first_out, first, again_out, again)


@pytest.mark.slow
def test_only_the_stages_after_a_change_run_again(tmp_path: Path,
                                                  first_builds: FirstBuilds) -> None:
    # find_spec, not importorskip: importing modelopt here would patch onnxruntime.quantization
    # in the test process (the precision tests check that ModelOpt stays out of it)
    if importlib.util.find_spec("modelopt") is None:
        pytest.skip("the precision stage needs nvidia-modelopt")
    cache, out = first_builds.cache, tmp_path / "out"
    assert _ran(first_builds.first) == ["export", "simplify", "verify", "cpu_model", "package"]
    # the repository is always written (hard links)
    assert _ran(first_builds.again) == ["package"]
    fp16 = _build(out, cache, "--precision", "fp16")
    assert _ran(fp16) == ["precision", "package"]
    assert all(fp16[n]["cached"] for n in ("export", "simplify", "verify"))
    fp16_again = _build(out, cache, "--precision", "fp16")
    assert _ran(fp16_again) == ["package"]
    other_opset = _build(out, cache, "--precision", "fp16", "--opset", "17")
    assert _ran(other_opset) == ["export", "simplify", "verify", "precision", "package"]
    forced = _build(out, cache, "--precision", "fp16", "--no-cache")
    assert _ran(forced) == ["export", "simplify", "verify", "precision", "package"]


def test_records_and_cache_entries_written_beside_later_stages_are_whole(
        first_builds: FirstBuilds) -> None:
    """A stage's sha256 records and its cache entry are made on a thread while the next
    stages run (``StageRuns._record``): the report still lists every file of every stage
    with its sha256, and the rebuild finds every entry stored, with the same records."""
    first, again = first_builds.first, first_builds.again
    made = {"export", "simplify", "verify", "cpu_model"}
    assert {n for n, s in first.items() if s["artifacts"]} == made
    for stage in first.values():
        for record in stage["artifacts"]:
            assert sha256_file(first_builds.first_out / record["path"]) == record["sha256"], \
                record["path"]
    assert _ran(again) == ["package"]
    for name in made:
        assert again[name]["artifacts"] == first[name]["artifacts"], name


def test_half_written_cache_entries_are_never_hits(tmp_path: Path) -> None:
    cache = StageCache(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.onnx").write_bytes(b"onnx bytes")
    # an interrupted store: files under the temporary name, never renamed
    stale = tmp_path / "stages" / "export" / "k1.tmp-4242" / "files"
    stale.mkdir(parents=True)
    (stale / "model.onnx").write_bytes(b"half")
    assert cache.load("export", "k1", tmp_path / "dst1").meta is None
    # an entry folder without its metadata (written last) is not a hit either
    (tmp_path / "stages" / "export" / "k2" / "files").mkdir(parents=True)
    assert cache.load("export", "k2", tmp_path / "dst2").meta is None
    cache.store("export", "k3", src, {"artifacts": {"onnx": "model.onnx"}})
    dst = tmp_path / "dst3"
    meta = cache.load("export", "k3", dst).meta
    assert meta is not None and meta["artifacts"] == {"onnx": "model.onnx"}
    assert (dst / "model.onnx").read_bytes() == b"onnx bytes"
    assert not list((tmp_path / "stages" / "export").glob("k3.tmp-*"))


def test_changed_trtpack_code_is_never_served_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first_builds: FirstBuilds
) -> None:
    """A change to a module a stage runs (here one only the simplify stage imports) runs
    that stage and the ones after it again; the stages before it stay hits. (Its entries
    are stored under keys of the edited code, which no other build here computes.)"""
    from trtpack.pipeline import keys

    cache, out = first_builds.cache, tmp_path / "out"
    assert _ran(first_builds.again) == ["package"]  # the unedited code's entries: all hits
    edited = "trtpack.onnx_tools.simplify_graph"

    class EditedSources(keys.PackageSources):
        def __getitem__(self, name: str) -> str:
            return super().__getitem__(name) + ("\n# edited\n" if name == edited else "")

    monkeypatch.setattr(keys, "package_sources", EditedSources)
    keys.stage_dependencies.cache_clear()
    try:
        assert _ran(_build(out, cache, "--precision", "fp32")) == [
            "simplify", "verify", "cpu_model", "package"]
    finally:
        keys.stage_dependencies.cache_clear()
