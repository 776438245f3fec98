"""The stage cache's second level: an S3-compatible object store shared by many machines
(``--cache-url s3://BUCKET/PREFIX`` or ``TRTPACK_CACHE_URL``). The local cache
(``pipeline.cache``) stays the first level: a stage is looked up there, then in the bucket; an
entry found in the bucket is downloaded into the local cache, checked there against the sizes
and BLAKE3 hashes its manifest records (``cache.damage``, the one check of an entry) and only
then used; a damaged or partial entry is absent: its stage runs again and its entry is
replaced. Of an entry whose stage is a hit but whose files a later stage reads, only the
files of the artifacts read are downloaded (checked the same way), into a folder of their
own that the build removes at its end: a second runner packaging the FP16 model reads the
export's reference inputs and tokenizer, not its FP32 weights (``RemoteCache.fetch``).

The bucket holds, under PREFIX:

- ``blobs/<blake3>``: every file of every entry, named by its BLAKE3 (the same file in many
  entries is stored once);
- ``stages/<stage>/<key>.json``: an entry's manifest, the local entry's metadata (its
  result, its artifacts, and each file's path, size and BLAKE3).

Publishing uploads the blobs first and the manifest last, with a conditional put
(``If-None-Match: *``) where the store supports it: an entry is visible only once all its
files are there, an interrupted upload leaves at most blobs no manifest names (pruned by age,
``docs/fleet.md``), and of two machines writing one key the first manifest stays.

The store failing (unreachable, refusing the credentials, an error) never fails a build: the
first failure turns the remote cache off for the rest of the build with one warning, and the
build goes on with the local cache. Credentials come from the AWS chain (environment, shared
files, instance or container roles) through boto3; they are never written anywhere by trtpack.
The client is boto3 (imported here only, inside the functions that talk to the store)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtpack.json_values import JsonObject, json_object, json_text
from trtpack.machine.object_store import READ_TIMEOUT_S, s3_client
from trtpack.machine.paths import CacheUrl
from trtpack.onnx_tools.files import DATA_SUFFIX
from trtpack.pipeline.cache import META, StageCache, damage
from trtpack.pipeline.cache_records import entry_files

BOTO3_INSTALL = "pip install 'trtpack[remote-cache]' (boto3)"
# tests: SIGKILL this process id (the test's object store) once an entry's first blob is up:
# the store dies in the middle of an upload, at the same point every time
KILL_STORE_VARIABLE = "TRTPACK_TEST_KILL_STORE_DURING_UPLOAD"

class StoreError(Exception):
    """The store failed; the message says how in words that carry no credential."""


def _describe(error: BaseException) -> str:
    """What went wrong, from the error's type and code only (never its message, which may
    quote a request)."""
    from botocore.exceptions import (
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        ReadTimeoutError,
    )

    if isinstance(error, ClientError):
        code = str(error.response.get("Error", {}).get("Code", "?"))
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
        return f"the store answered {code} (HTTP {status})"
    if isinstance(error, EndpointConnectionError | ConnectTimeoutError):
        return "could not connect to the store"
    if isinstance(error, ReadTimeoutError):
        return f"the store did not answer within {READ_TIMEOUT_S} s"
    if isinstance(error, NoCredentialsError):
        return "no AWS credentials were found"
    return f"{type(error).__name__}"


@dataclass
class RemoteEntry:
    """A manifest found in the bucket, not downloaded yet."""

    stage: str
    key: str
    meta: JsonObject

    @property
    def files(self) -> dict[str, tuple[int, str]]:
        """Its files (relative path -> (size, BLAKE3)), checked when it was found."""
        return entry_files(self.meta, f"{self.stage}'s remote entry")

    def files_of(self, names: frozenset[str]) -> dict[str, tuple[int, str]]:
        """Its files a stage reading the artifacts ``names`` needs: theirs (a file, the files
        under a folder, an ONNX model's ``.data`` sidecar), and every file no artifact owns
        (what it is for is not known here: kept)."""
        artifacts = {name: json_text(rel, f"{self.stage}'s remote entry: artifacts.{name}")
                     for name, rel in json_object(self.meta.get("artifacts"),
                                                  f"{self.stage}'s remote entry").items()}

        def owners(rel: str) -> set[str]:
            return {name for name, path in artifacts.items()
                    if rel in (path, path + DATA_SUFFIX) or rel.startswith(path + "/")}

        return {rel: record for rel, record in self.files.items()
                if not owners(rel) or owners(rel) & names}


@dataclass
class Fetched:
    """What ``RemoteCache.fetch`` did with an entry."""

    problem: str | None = None  # what was wrong with it (the stage runs; its entry replaced)
    # the part of it asked for, checked, in this folder (removed when the build ends: the
    # local cache holds whole entries only); None: the whole entry is in the local cache now
    part: Path | None = None


class RemoteCache:
    """The bucket behind one build's local ``StageCache``. Every method swallows the store's
    failures: the first turns the remote cache off (``off``) and calls ``warn`` once."""

    def __init__(self, url: CacheUrl, local: StageCache,
                 warn: Callable[[str], None]) -> None:
        self.url = url
        self.local = local
        self.warn = warn
        self.off: str | None = None  # why the remote cache stopped being used
        self._client: Any = None
        # entries found damaged by this build: published again in their place
        self._damaged: set[tuple[str, str]] = set()
        self._bad_blobs: set[str] = set()

    def _s3(self) -> Any:
        if self._client is None:
            self._client = s3_client()
        return self._client

    def _fail(self, doing: str, error: BaseException) -> None:
        if self.off is None:
            self.off = f"{doing}: {_describe(error)}"
            self.warn(f"the remote cache {self.url} is not used for the rest of this build "
                      f"({self.off}); building with the local cache only")

    def _manifest_key(self, stage: str, key: str) -> str:
        return self.url.key("stages", stage, f"{key}.json")

    def _blob_key(self, digest: str) -> str:
        return self.url.key("blobs", digest)

    def lookup(self, stage: str, key: str) -> RemoteEntry | None:
        """The entry's manifest, when the bucket has a readable one."""
        if self.off is not None:
            return None
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            body = self._s3().get_object(Bucket=self.url.bucket,
                                         Key=self._manifest_key(stage, key))["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            self._fail(f"reading {stage}'s entry", e)
            return None
        except BotoCoreError as e:
            self._fail(f"reading {stage}'s entry", e)
            return None
        try:
            meta = json_object(json.loads(body), f"{stage}'s remote entry")
            entry_files(meta, f"{stage}'s remote entry")
        except (ValueError, TypeError):
            self._damaged.add((stage, key))
            return None
        return RemoteEntry(stage, key, dict(meta))

    def fetch(self, entry: RemoteEntry, names: frozenset[str] | None = None) -> Fetched:
        """Download ``entry``, every file checked against its manifest's size and BLAKE3
        before anything uses it. All of it (``names`` None, or its artifacts ``names`` own
        every file) goes into the local cache; else only the files of the artifacts
        ``names`` (``RemoteEntry.files_of``) into a folder of their own (``Fetched.part``):
        a second runner reading the export's reference inputs and tokenizer does not
        download its FP32 weights. A damaged entry's problem is returned (it is replaced
        when this build stores the stage); a store that fails gives neither (the stage is
        simply a miss: ``off``)."""
        if self.off is not None:
            return Fetched()
        from botocore.exceptions import BotoCoreError, ClientError

        wanted = entry.files if names is None else entry.files_of(names)
        whole = len(wanted) == len(entry.files)
        tmp = self.local.temporary_entry(entry.stage, entry.key)
        kept = False
        try:
            for rel, (_, digest) in sorted(wanted.items()):
                path = tmp / "files" / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    self._s3().download_file(self.url.bucket, self._blob_key(digest),
                                             str(path))
                except ClientError as e:  # the store answered: this blob is missing or
                    # unreadable (a store that crashed while writing it), the entry damaged
                    self._damaged.add((entry.stage, entry.key))
                    self._bad_blobs.add(digest)
                    if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                        return Fetched(f"{rel} is missing from the bucket")
                    return Fetched(f"{rel} could not be read from the bucket ({_describe(e)})")
            if whole:
                problem = self.local.adopt(entry.stage, entry.key, tmp, entry.meta)
            else:
                problem = damage(tmp / "files", wanted)
            if problem is not None:
                self._damaged.add((entry.stage, entry.key))
                self._bad_blobs.update(d for _, d in wanted.values())
                return Fetched(problem)
            kept = not whole
            return Fetched(part=tmp / "files" if kept else None)
        except (BotoCoreError, ClientError) as e:
            self._fail(f"downloading {entry.stage}'s entry", e)
            return Fetched()
        finally:
            if not kept:
                shutil.rmtree(tmp, ignore_errors=True)

    def publish(self, stage: str, key: str) -> None:
        """Upload the local entry ``stage``/``key``: its blobs the bucket lacks, then its
        manifest (conditional: a manifest another machine put first stays, unless this build
        found that one damaged)."""
        if self.off is not None:
            return
        from botocore.exceptions import BotoCoreError, ClientError

        entry = self.local.entry_path(stage, key)
        try:
            meta_bytes = (entry / META).read_bytes()
            files = entry_files(json.loads(meta_bytes), f"{stage}'s entry")
        except (OSError, ValueError, KeyError, TypeError):
            return  # not stored locally (a full disk): nothing to share
        replace = (stage, key) in self._damaged
        s3 = self._s3()
        try:
            if not replace and self._has(s3, self._manifest_key(stage, key)):
                return
            for n, (rel, (_, digest)) in enumerate(sorted(files.items())):
                blob = self._blob_key(digest)
                if digest in self._bad_blobs or not self._has(s3, blob):
                    s3.upload_file(str(entry / "files" / rel), self.url.bucket, blob)
                if n == 0:
                    _kill_store_for_tests()
            extra = {} if replace else {"IfNoneMatch": "*"}
            try:
                s3.put_object(Bucket=self.url.bucket, Key=self._manifest_key(stage, key),
                              Body=meta_bytes, ContentType="application/json", **extra)
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") not in (
                        "PreconditionFailed", "ConditionalRequestConflict"):
                    raise  # else another machine published this key first: it stays
        except (BotoCoreError, ClientError) as e:
            self._fail(f"publishing {stage}'s entry", e)

    def _has(self, s3: Any, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            s3.head_object(Bucket=self.url.bucket, Key=key)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return False
            raise
        return True


def _kill_store_for_tests() -> None:
    pid = os.environ.get(KILL_STORE_VARIABLE, "")
    if pid.isdigit():
        with contextlib.suppress(OSError):
            os.kill(int(pid), signal.SIGKILL)
