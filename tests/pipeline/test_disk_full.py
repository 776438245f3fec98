"""A full disk (ENOSPC) anywhere in a build: exit 4, one line naming the path, the free space
and what the build needs (from the model's size), and nothing left beside OUT but the
failed build's report and logs (``OUT.failed``); no half-written cache entry.

Two ways to fill a disk: a small tmpfs mounted by the test (needs root and mount rights,
skipped where CI has neither), and, everywhere, an ENOSPC injected at each stage's writes
(a ``sitecustomize`` on the build's PYTHONPATH makes every open-for-writing under that
stage's folder fail as a full disk would: labelled a stand-in)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BUILD = ["build", "tiny-bert", "--random-weights", "--target", "cpu",
         "--profile", "1x4:2x8:4x16"]
MESSAGE = re.compile(r"^error: stage '(\w+)' failed: no space left on device writing (\S+): "
                     r"[\d,]+ [KM]B free, the build needs about [\d,]+ [KM]B \(3 x the model's "
                     r"[\d,]+ [KM]B of weights\)")

INJECT = '''
import builtins, errno, io, os

_STAGE_DIR = os.sep + os.environ["TRTPACK_TEST_ENOSPC_IN"] + os.sep
_open, _os_open = builtins.open, os.open


def _full(path):
    return _STAGE_DIR in os.fspath(path) + os.sep if isinstance(path, (str, bytes, os.PathLike)) \\
        and not isinstance(path, bytes) else False


def open(file, mode="r", *args, **kwargs):
    if any(c in mode for c in "wax+") and _full(file):
        raise OSError(errno.ENOSPC, "No space left on device", os.fspath(file))
    return _open(file, mode, *args, **kwargs)


def os_open(path, flags, *args, **kwargs):
    if flags & (os.O_WRONLY | os.O_RDWR) and _full(path):
        raise OSError(errno.ENOSPC, "No space left on device", os.fspath(path))
    return _os_open(path, flags, *args, **kwargs)


builtins.open = io.open = open
os.open = os_open
'''


def run_build(out: Path, cache: Path, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trtpack.cli", *BUILD, "--out", str(out),
                           "--cache-dir", str(cache)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})}, check=False)


def assert_disk_full(result: subprocess.CompletedProcess[str], out: Path,
                     stage: str | None = None) -> str:
    """Exit 4, the one line, and only OUT.failed's report and logs left; the failed stage."""
    assert result.returncode == 4, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    match = MESSAGE.match(errors[0])
    assert match, errors[0]
    assert match.group(2) == str(out.resolve()), errors[0]
    if stage is not None:
        assert match.group(1) == stage, errors[0]
    beside = {p.name for p in out.parent.iterdir()} - {"cache"}
    assert beside == {out.name + ".failed"}, beside
    failed = out.parent / (out.name + ".failed")
    assert {p.name for p in failed.iterdir()} <= {"report.json", "report.html", "logs",
                                                 ".trtpack-manifest.json"}
    report = json.loads((failed / "report.json").read_text())
    assert report["status"] == "failed" and "no space left" in report["error"]
    cache = out.parent / "cache"
    assert not [p for p in cache.rglob("*") if ".tmp-" in p.name] if cache.exists() else True
    return match.group(1)


def can_mount(tmp_path: Path) -> bool:
    if os.geteuid() != 0:
        return False
    probe = tmp_path / "probe"
    probe.mkdir()
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
                        capture_output=True, check=False).returncode == 0
    if ok:
        subprocess.run(["umount", str(probe)], check=True)
    probe.rmdir()
    return ok


@pytest.mark.parametrize("size", ["300k", "1200k"])
def test_a_small_filesystem_fills(tmp_path: Path, size: str) -> None:
    """A real full disk: OUT and the cache on a tmpfs too small for the build (300 KB fills
    during the export, 1.2 MB later, when the repository is written)."""
    if not can_mount(tmp_path):
        pytest.skip("cannot mount a tmpfs here (not root, or no mount rights)")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                   check=True)
    try:
        result = run_build(disk / "out", disk / "cache")
        assert_disk_full(result, disk / "out")
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


STAGES = ["export", "simplify", "verify", "cpu_model", "package"]  # a CPU build's, in order


@pytest.fixture(scope="module")
def whole_build_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cache of the build run once whole (no ENOSPC): the stages before the one a test
    fills the disk in are taken from it, so that only that stage and the ones after it run."""
    folder = tmp_path_factory.mktemp("whole")
    result = run_build(folder / "out", folder / "cache")
    assert result.returncode == 0, result.stderr
    return folder / "cache"


def cache_before(whole: Path, stage: str, cache: Path) -> None:
    """``cache`` holding a copy of ``whole``'s entries of the stages before ``stage``."""
    for earlier in STAGES[:STAGES.index(stage)]:
        shutil.copytree(whole / "stages" / earlier, cache / "stages" / earlier)


@pytest.mark.parametrize("stage", ["export", "simplify", "verify", "package"])
def test_an_injected_enospc_at_each_stages_writes(tmp_path: Path, stage: str,
                                                  whole_build_cache: Path) -> None:
    """Stand-in for a full disk: ENOSPC injected at the stage's writes (see the module); the
    stages before it are reused from a cache (each test's copy), the stage itself runs."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(INJECT)
    pythonpath = os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")])
    # package writes the repository beside its own folder
    folder = ".model_repository.tmp" if stage == "package" else f"artifacts{os.sep}{stage}"
    base = tmp_path / "builds"
    base.mkdir()
    cache_before(whole_build_cache, stage, base / "cache")
    result = run_build(base / "out", base / "cache",
                       {"PYTHONPATH": pythonpath, "TRTPACK_TEST_ENOSPC_IN": folder})
    assert_disk_full(result, base / "out", stage)
    # the report lists the stages finished before it: each reused, none run
    finished = {s["name"]: s["cached"] for s in json.loads(
        (base / "out.failed" / "report.json").read_text())["stages"] if s["status"] == "ok"}
    assert finished == dict.fromkeys(STAGES[:STAGES.index(stage)], True), finished
