"""Ctrl-C (SIGINT) or SIGTERM at the start of export, simplify or precision, into a fresh or
an existing OUT: trtpack exits 130, no process of the build is left running, no partial
folder is left, and an existing OUT is untouched.

The build's processes are found by an environment variable only this build carries (every
process it starts inherits it), so an orphan reparented to init is found too. With the test
suite's stage server on, the build's stage processes are forked by the server (their
``/proc/PID/environ`` is the server's): they are found by the pids its log gives, and every
process in their process groups must be gone too. The mark rides on ``PYTEST_CURRENT_TEST``,
a variable the server lets a build change (``CALL_TIME_VARIABLES``)."""

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

from tests.conftest import sigint_as_default
from trtpack.onnx_tools.files import sha256_file
from trtpack.pipeline.stage_server import served_in_log

MARK = "PYTEST_CURRENT_TEST"  # a variable the stage server lets differ
SERVED_SECONDS = 30  # the served processes' group, SIGKILLed as the build stopped, gone by then
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


class ServerLog:
    """The stage processes the test suite's stage server (None: off) served since now."""

    def __init__(self, folder: Path | None) -> None:
        self.path = Path(f"{folder}.log") if folder is not None else None
        self.offset = self.path.stat().st_size if self.path and self.path.exists() else 0

    def served(self) -> list[int]:
        if self.path is None or not self.path.exists():
            return []
        with open(self.path, "rb") as log:
            log.seek(self.offset)
            text = log.read().decode(errors="replace")
        return [pid for _, pid in served_in_log(text)]


def running_in_groups(groups: list[int]) -> list[int]:
    """Live (not zombie) processes whose process group is one of ``groups``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) in groups:
            found.append(int(entry.name))
    return found


def describe(pid: int) -> str:
    try:
        return f"{pid}: " + (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(
            b"\0", b" ").decode()
    except OSError:
        return f"{pid}: gone"


def start_build(out: Path, mark: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, MARK: mark}
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
                                                   tmp_path: Path, finished_build: Path,
                                                   stage_server: Path | None) -> None:
    out = tmp_path / "out"
    if existing:
        shutil.copytree(finished_build, out)
        before = sha256_file(out / "report.json")
    # the test's id first: the server's log names the test a build runs in by it
    mark = f"{os.environ.get(MARK, '').split(' ')[0]} interrupt-{uuid.uuid4().hex}"
    server_log = ServerLog(stage_server)
    proc = start_build(out, mark)

    def processes() -> list[int]:
        return build_processes(mark) + running_in_groups(server_log.served())

    try:
        wait_for_stage(proc, out, stage)
        # export and simplify run in stage processes; precision starts ModelOpt's: signal
        # once the build has a process of its own running
        deadline = time.monotonic() + 120
        while len(processes()) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(processes()) >= 2, "the stage started no process"
        os.kill(proc.pid, signum)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, proc.stderr.read().decode() if proc.stderr else ""
    assert [describe(pid) for pid in build_processes(mark)] == []
    # the build waited for its served stage process's end and SIGKILLed its group: whatever
    # was in it is gone, or dying
    deadline = time.monotonic() + SERVED_SECONDS
    while running_in_groups(server_log.served()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [describe(pid) for pid in running_in_groups(server_log.served())] == []
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
