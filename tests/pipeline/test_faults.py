"""What the machine does to builds: a build killed by SIGKILL (its leftovers swept by the
next build), a stage process killed by SIGKILL (standing in for the out-of-memory killer),
two builds of one OUT at once (the second waits; never a mixed OUT), and two builds of
different models sharing a cache at once (both succeed, every entry sound)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import run_cli, without_stage_server
from trtpack.onnx_tools.files import sha256_file
from trtpack.out_files import files_under, manifest_files
from trtpack.pipeline.cache import StageCache
from trtpack.pipeline.faults import killed_message

BUILD = ["build", "tiny-bert", "--random-weights", "--target", "cpu"]


def start(out: Path, cache: Path, *extra: str, model: str = "tiny-bert", fresh: bool = False
          ) -> subprocess.Popen[str]:
    """The build in a process of its own (``fresh``: its stage processes its children, not
    a stage server's)."""
    return subprocess.Popen(
        [sys.executable, "-m", "trtpack.cli", "build", model, "--random-weights", "--target",
         "cpu", "--out", str(out), "--cache-dir", str(cache), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=without_stage_server(dict(os.environ)) if fresh else None)


def wait_for(condition, proc: subprocess.Popen[str], what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 300
    while not condition():
        assert proc.poll() is None, f"the build ended before {what}: {proc.stderr.read()}"  # type: ignore[union-attr]
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.02)


def stage_started(out: Path, proc: subprocess.Popen[str], stage: str) -> bool:
    return (out.with_name(f".{out.name}.partial-{proc.pid}") / "artifacts" / stage).is_dir()


def assert_consistent(out: Path) -> dict:  # type: ignore[type-arg]
    """OUT is one build's, whole: its manifest lists exactly its files and every artifact the
    report records has the recorded sha256."""
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "ok"
    assert sorted(manifest_files(out) or []) == files_under(out)
    for stage in report["stages"]:
        for artifact in stage["artifacts"]:
            assert sha256_file(out / artifact["path"]) == artifact["sha256"], artifact["path"]
    return report  # type: ignore[no-any-return]


@pytest.mark.slow
def test_a_build_killed_by_sigkill_is_swept_by_the_next(tmp_path: Path) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    assert run_cli(*BUILD, "--out", str(out), "--cache-dir", str(cache)).exit_code == 0
    proc = start(out, cache, "--no-cache")
    wait_for(lambda: stage_started(out, proc, "export"), proc, "the export started")
    partial = out.with_name(f".{out.name}.partial-{proc.pid}")
    os.kill(proc.pid, signal.SIGKILL)  # the OOM killer or a CI timeout
    proc.wait()
    assert partial.is_dir()  # what a killed build leaves: nothing could clean it
    assert (out / "report.json").is_file()  # the earlier OUT is intact
    again = run_cli(*BUILD, "--out", str(out), "--cache-dir", str(cache))
    assert again.exit_code == 0, again.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "out"]
    assert_consistent(out)


@pytest.mark.slow
def test_a_stage_process_killed_by_sigkill_is_said_in_words(tmp_path: Path) -> None:
    """SIGKILL sent by the test stands in for the kernel's out-of-memory killer (which cannot
    be invoked safely on a shared machine): no OOM kill is counted, so the message gives the
    signal and the peak memory against what is available."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    proc = start(out, cache, fresh=True)  # its export process found among its children
    wait_for(lambda: stage_started(out, proc, "export"), proc, "the export started")
    stage = next(p for p in psutil.Process(proc.pid).children()
                 if "trtpack.pipeline.isolate" in p.cmdline() and p.cmdline()[-2] == "export")
    stage.send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 4, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    assert re.search(r"stage 'export' failed: the export process was killed by signal 9 "
                     r"\(peak \d+\.\d GB of \d+\.\d GB available\)", errors[0]), errors[0]
    assert "out-of-memory" not in stderr
    failed = tmp_path / "out.failed"
    assert json.loads((failed / "report.json").read_text())["status"] == "failed"
    assert "killed by signal 9" in (failed / "logs" / "export.log").read_text()
    assert {p.name for p in tmp_path.iterdir()} - {"cache"} == {"out.failed"}


def test_an_oom_kill_counted_by_the_cgroup_is_named(tmp_path: Path) -> None:
    """The cgroup's memory.events, written by the test (a real OOM kill cannot be provoked
    safely here): the message names the OOM killer only when its count went up."""
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (tmp_path / "memory.max").write_text(str(2**30) + "\n")  # 1 GB: below any machine's
    said = killed_message("precision", 9, 0, 1, 0.9 * 1024, tmp_path)
    assert said == ("the precision process was killed by the kernel's out-of-memory killer "
                    "(peak 0.9 GB of 1.0 GB available)")
    not_oom = killed_message("precision", 9, 1, 1, 0.2 * 1024, tmp_path)
    assert not_oom == ("the precision process was killed by signal 9 (peak 0.2 GB of 1.0 GB "
                       "available)")


@pytest.mark.slow
def test_two_builds_of_one_out_at_once_never_mix(tmp_path: Path) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    first = start(out, cache, "--profile", "1x4:2x8:4x16", "--no-cache")
    lock = tmp_path / ".out.lock"
    wait_for(lambda: lock.is_file() and lock.read_text() == str(first.pid), first,
             "the first build took the lock")
    second = start(out, cache, "--profile", "2x16:4x32:8x64", "--no-cache")
    _, first_err = first.communicate(timeout=300)
    _, second_err = second.communicate(timeout=300)
    assert first.returncode == 0, first_err
    assert second.returncode == 0, second_err
    waiting = [line for line in second_err.splitlines() if line.startswith("waiting")]
    assert waiting == [f"waiting: another trtpack build (pid {first.pid}) is writing "
                       f"{out.resolve()}"], second_err
    report = assert_consistent(out)
    assert len(report["profiles"]) == 1 and "2x16:4x32:8x64" in report["profiles"][0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no lock, partial, old


@pytest.mark.slow
def test_two_models_sharing_a_cache_at_once_both_build(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    other = tmp_path / "tiny-bert-3.yaml"
    recipe = (Path(__file__).parents[2] / "recipes" / "tiny-bert.yaml").read_text()
    other.write_text(recipe.replace("name: tiny-bert", "name: tiny-bert-3")
                     .replace("num_hidden_layers: 2", "num_hidden_layers: 3"))
    one = start(tmp_path / "one", cache)
    two = start(tmp_path / "two", cache, model=str(other))
    for proc in (one, two):
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr
    assert assert_consistent(tmp_path / "one")["model"] == "tiny-bert"
    assert assert_consistent(tmp_path / "two")["model"] == "tiny-bert-3"
    entries = StageCache(cache).entries()
    assert sorted(e.stage for e in entries) == ["cpu_model", "cpu_model", "export", "export",
                                                "simplify", "simplify", "verify", "verify"]
    assert StageCache(cache).verify() == []
    assert not [p for p in (cache / "stages").rglob("*.tmp-*")]
