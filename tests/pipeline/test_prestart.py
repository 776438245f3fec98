"""``trtpack build`` starts its first stage's process before anything else
(``pipeline.prestart``): the build takes that process for its export, its output ends up in
the stage log, and a process no build takes (a rebuild from the cache, a usage error) is
ended with nothing left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.conftest import python_path, without_stage_server
from trtpack.pipeline.prestart import first_stage, may_reuse, option_value

BUILD = ("build", "tiny-bert", "--random-weights", "--target", "cpu", "--precision", "fp32",
         "--profile", "1x4:2x8:4x16")


def test_the_first_stage_is_known_from_the_command_line() -> None:
    assert first_stage(["build", "minilm", "--target", "cpu"]) == "export"
    assert first_stage(["build", "models/detector.ONNX"]) == "import"
    assert first_stage(["build", "minilm", "--help"]) is None
    assert first_stage(["build", "--profile", "1x8", "minilm"]) is None  # not guessed
    assert first_stage(["bench", "build/minilm"]) is None
    assert first_stage(["build"]) is None


def _start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    # the stage processes looked for are the build's children: none from a stage server
    env = without_stage_server({**os.environ, "TMPDIR": str(tmp_path / "tmp"),
                                "PYTHONPATH": python_path()})
    return subprocess.Popen([sys.executable, "-m", "trtpack.cli", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _stage_processes(proc: subprocess.Popen[str]) -> dict[int, list[str]]:
    """pid -> command line of the build's stage processes, sampled until it ends."""
    seen: dict[int, list[str]] = {}
    parent = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            for child in parent.children(recursive=True):
                cmd = child.cmdline()
                if "trtpack.pipeline.isolate" in cmd:
                    seen.setdefault(child.pid, cmd)
        except psutil.Error:
            pass
        time.sleep(0.01)
    return seen


def test_the_build_takes_the_prestarted_export_process(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    out, cache = tmp_path / "out", tmp_path / "cache"
    proc = _start(tmp_path, *BUILD, "--out", str(out), "--cache-dir", str(cache))
    seen = _stage_processes(proc)
    _, stderr = proc.communicate()
    assert proc.returncode == 0, stderr
    exports = [cmd for cmd in seen.values() if cmd[-2] == "export"]
    # one export process, started with a temporary log: the prestarted one, taken
    assert len(exports) == 1, exports
    assert Path(exports[0][-1]).parent == tmp_path / "tmp"
    assert "exporting to ONNX" in (out / "logs" / "export.log").read_text()
    assert list((tmp_path / "tmp").glob("trtpack-*.log")) == []  # its temporary log moved, removed

    # a rebuild (the cache holds an export) starts none: it would not be used
    proc = _start(tmp_path, *BUILD, "--out", str(out), "--cache-dir", str(cache))
    seen = _stage_processes(proc)
    _, stderr = proc.communicate()
    assert proc.returncode == 0, stderr
    assert seen == {}
    assert list((tmp_path / "tmp").glob("trtpack-*.log")) == []


def test_a_cache_holding_the_stage_or_no_cache_decides(tmp_path: Path) -> None:
    argv = ["build", "minilm", "--cache-dir", str(tmp_path / "cache")]
    assert option_value(argv, "--cache-dir") == str(tmp_path / "cache")
    assert option_value(["build", "x", f"--cache-dir={tmp_path}"], "--cache-dir") == str(tmp_path)
    assert not may_reuse(argv, "export")  # no cache folder yet
    entries = tmp_path / "cache" / "stages" / "export"
    (entries / "k1.tmp-42").mkdir(parents=True)  # a store in progress is no entry
    assert not may_reuse(argv, "export")
    (entries / "k1").mkdir()
    assert may_reuse(argv, "export") and not may_reuse(argv, "import")
    assert not may_reuse([*argv, "--no-cache"], "export")


def test_a_usage_error_leaves_no_prestarted_process_behind(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    proc = _start(tmp_path, "build", "tiny-bert", "--no-such-flag")
    seen = _stage_processes(proc)
    _, stderr = proc.communicate()
    assert proc.returncode == 2, stderr
    assert "no-such-flag" in stderr
    time.sleep(0.2)
    assert all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
               for pid in seen)
    assert list((tmp_path / "tmp").glob("trtpack-*.log")) == []
