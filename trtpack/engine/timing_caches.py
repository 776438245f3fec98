"""TensorRT timing caches shared by a fleet's engine jobs through the remote cache's bucket,
one set per device: (GPU model, compute capability, TensorRT version, hardware-compatibility
level), the stem of the local file (``builder.timing_cache_path``).

    s3://BUCKET/PREFIX/timing-caches/<device>/<blake3 of the cache>.cache

Each engine job uploads its own object (named by its content: no object is ever rewritten,
no read-modify-write of a shared one), and a job starting combines every object of its
device into its local cache with TensorRT's ``ITimingCache.combine`` (``combine_caches``),
so the fifth engine job of a family starts from the tactics the first four measured.

The TensorRT API used, as its Python bindings define it (NVIDIA/TensorRT at 922d13f,
``python/src/infer/pyCore.cpp``: ``.def("combine", &ITimingCache::combine, "input_cache"_a,
"ignore_mismatch"_a)``; ``python/docstrings/infer/pyCoreDoc.h``, ``ITimingCacheDoc`` and
``IBuilderConfigDoc``):

- ``IBuilderConfig.create_timing_cache(serialized_timing_cache) -> ITimingCache``: ``b""``
  makes a new, empty cache;
- ``ITimingCache.combine(input_cache, ignore_mismatch) -> bool``: appends the input's entries
  (conflicting ones skipped); a cache from another TensorRT version is skipped (False), and
  one from another device only with ``ignore_mismatch`` True, which trtpack never sets: the
  objects are already per device, and a cache timed elsewhere is refused, not mixed in;
- ``ITimingCache.serialize() -> IHostMemory`` (a buffer).

TensorRT-RTX 1.7.1 (the builder these CPU-only machines have) keeps the API and records no
tactics (``tests/engine/test_tensorrt_rtx_timing_cache.py``): the combine runs through it,
on empty caches; what it does with entries is tested against a labelled stand-in of this
interface (``tests/engine/test_shared_timing_caches.py``), never on a GPU here."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trtpack.machine.object_store import s3_client
from trtpack.machine.paths import CacheUrl

FOLDER = "timing-caches"
MAX_OBJECTS = 64  # a device's newest objects combined; older ones are left to pruning


class TimingCacheConfig(Protocol):
    """What trtpack uses of TensorRT's ``IBuilderConfig`` for a combine."""

    def create_timing_cache(self, serialized_timing_cache: bytes) -> Any: ...


@dataclass(frozen=True)
class Combined:
    serialized: bytes
    combined: int  # the inputs TensorRT combined
    refused: int  # the inputs it could not read, or skipped (another device or version)


def combine_caches(config: TimingCacheConfig, caches: Sequence[bytes]) -> Combined:
    """``caches`` combined into one new cache with ``ITimingCache.combine`` (never
    ``ignore_mismatch``), serialized."""
    merged = config.create_timing_cache(b"")
    combined = refused = 0
    for blob in caches:
        cache = config.create_timing_cache(blob) if blob else None
        if cache is not None and bool(merged.combine(cache, False)):
            combined += 1
        else:  # None: TensorRT could not read it (its binding returns the null pointer)
            refused += 1
    with memoryview(merged.serialize()) as buffer:
        return Combined(bytes(buffer), combined, refused)


def content_key(data: bytes) -> str:
    import blake3

    return blake3.blake3(data).hexdigest()


@dataclass
class SharedTimingCaches:
    """The bucket's timing caches of one device; every store failure is one ``warn`` and
    the build goes on with the local cache alone."""

    url: CacheUrl
    device: str  # the local file's stem: timing-<GPU>-sm<XY>-trt<version>[-<level>]
    warn: Callable[[str], None] = lambda message: None
    failed: str | None = None
    _client: Any = field(default=None, repr=False)

    def _s3(self) -> Any:
        if self._client is None:
            self._client = s3_client()
        return self._client

    def _fail(self, doing: str, error: BaseException) -> None:
        if self.failed is None:
            self.failed = f"{doing}: {type(error).__name__}"
            self.warn(f"the shared timing caches in {self.url} are not used ({self.failed})")

    def key(self, digest: str) -> str:
        return self.url.key(FOLDER, self.device, f"{digest}.cache")

    def download(self) -> list[bytes]:
        """The device's objects, newest first (at most ``MAX_OBJECTS``)."""
        if self.failed is not None:
            return []
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            s3 = self._s3()
            found = []
            pages = s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.url.bucket, Prefix=self.url.key(FOLDER, self.device) + "/")
            for page in pages:
                found += page.get("Contents", [])
            found.sort(key=lambda o: o["LastModified"], reverse=True)
            return [s3.get_object(Bucket=self.url.bucket, Key=o["Key"])["Body"].read()
                    for o in found[:MAX_OBJECTS]]
        except (BotoCoreError, ClientError) as e:
            self._fail("listing them", e)
            return []

    def upload(self, data: bytes) -> str | None:
        """This job's cache as an object of its own (named by its content); its key."""
        if self.failed is not None or not data:
            return None
        from botocore.exceptions import BotoCoreError, ClientError

        key = self.key(content_key(data))
        try:
            self._s3().put_object(Bucket=self.url.bucket, Key=key, Body=data,
                                  IfNoneMatch="*")
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in (
                    "PreconditionFailed", "ConditionalRequestConflict"):
                return key  # another job uploaded these very bytes
            self._fail("uploading this job's", e)
            return None
        except BotoCoreError as e:
            self._fail("uploading this job's", e)
            return None
        return key


def combine_into(path: Path, config: TimingCacheConfig, downloaded: Sequence[bytes]
                 ) -> Combined:
    """The local cache file ``path`` (if any) and ``downloaded`` combined, written back to
    ``path`` whole (a temporary file renamed)."""
    local = path.read_bytes() if path.is_file() else b""
    result = combine_caches(config, [local, *downloaded] if local else list(downloaded))
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.",
                                     delete=False) as f:
        f.write(result.serialized)
    Path(f.name).replace(path)
    return result
