"""Ctrl-C (SIGINT) or SIGTERM at the start of export, simplify or precision, into a fresh or
an existing OUT: trtpack exits 130, no process of the build is left running, no partial
folder is left, and an existing OUT is untouched.

The build's processes are found by an environment variable only this build carries (every
process it starts inherits it), so an orphan reparented to init is found too."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import sigint_as_default, without_stage_server
from trtpack.onnx_tools.files import sha256_file

MARK = "TRTPACK_TEST_BUILD_MARK"
BUILD = ["build", "tiny-bert", "--random-weights", "--target", "g5", "--no-engine",
         "--precision", "fp16",
         "--profile", "1x4:2x8:4x16", "--no-cache"]


def build_processes(mark: str) -> list[int]:
    """Live processes whose environment carries ``MARK=mark``."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def describe(pid: int) -> str:
    try:
        return f"{pid}: " + (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(
            b"\0", b" ").decode()
    except OSError:
        return f"{pid}: gone"


def start_build(out: Path, mark: str) -> subprocess.Popen[bytes]:
    # the build's processes are found by the environment they started with: fresh ones
    env = without_stage_server({**os.environ, MARK: mark})
    return subprocess.Popen([sys.executable, "-m", "trtpack.cli", *BUILD, "--out", str(out)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=sigint_as_default)


def wait_for_stage(proc: subprocess.Popen[bytes], out: Path, stage: str) -> None:
    """Until the build's temporary folder has ``artifacts/<stage>`` (the stage started)."""
    folder = out.with_name(f".{out.name}.partial-{proc.pid}") / "artifacts" / stage
    deadline = time.monotonic() + 300
    while not folder.is_dir():
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() < deadline, f"{stage} never started"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def finished_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "out"
    proc = subprocess.run([sys.executable, "-m", "trtpack.cli", *BUILD, "--out", str(out)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("existing", [False, True], ids=["fresh-out", "existing-out"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("stage", ["export", "simplify", "precision"])
def test_a_signal_in_a_stage_leaves_nothing_behind(stage: str, signum: int, existing: bool,
                                                   tmp_path: Path, finished_build: Path
                                                   ) -> None:
    out = tmp_path / "out"
    if existing:
        shutil.copytree(finished_build, out)
        before = sha256_file(out / "report.json")
    mark = uuid.uuid4().hex
    proc = start_build(out, mark)
    try:
        wait_for_stage(proc, out, stage)
        # export and simplify run in stage processes; precision starts ModelOpt's: signal
        # once the build has a process of its own running
        deadline = time.monotonic() + 120
        while len(build_processes(mark)) < 2 and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(build_processes(mark)) >= 2, "the stage started no process"
        os.kill(proc.pid, signum)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, proc.stderr.read().decode() if proc.stderr else ""
    assert [describe(pid) for pid in build_processes(mark)] == []
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "out")
    assert left == []  # no .out.partial-*, no out.failed
    if existing:
        assert sha256_file(out / "report.json") == before
        assert (out / "model_repository" / "tiny-bert").is_dir()
    else:
        assert not out.exists()


def test_the_process_finder_finds_a_marked_process() -> None:
    """``build_processes`` sees a process carrying the mark (so the test above can fail)."""
    mark = uuid.uuid4().hex
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             env={**os.environ, MARK: mark})
    try:
        deadline = time.monotonic() + 10
        while child.pid not in build_processes(mark) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert build_processes(mark) == [child.pid]
    finally:
        child.kill()
        child.wait()
    assert build_processes(mark) == []
