"""trtpack bench says how far to trust its numbers: every runtime timed in rotation over
5 rounds with the spread of their medians, one thread policy for every row (said in the
output), and a row flagged, with every ratio against it, when its rounds disagree or other
processes loaded the machine while it ran — in the terminal and in report.html, whose header
then shows no "served vs PyTorch" range as a fact."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import trtpack
from trtpack.bench.benchmark import add_speedups, timed_row
from trtpack.bench.timing import BUSY_SHARE, CpuSample, others_cpu_share
from trtpack.cases import Case
from trtpack.report import BenchRow
from trtpack.report_page.html import speedup_cards
from trtpack.timing import SLICES, Timing, measure_interleaved, spread


def bench_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``trtpack bench ARGS``, wide, with OpenMP's wait policy left to trtpack."""
    return trtpack("bench", *args, env={"COLUMNS": "200"}, unset=("OMP_WAIT_POLICY",))


@pytest.fixture
def tiny_copy(tiny_build: Path, tmp_path: Path) -> Path:
    out = tmp_path / "tiny"
    shutil.copytree(tiny_build, out)
    return out


def test_rotation_keeps_five_rounds_apart() -> None:
    calls = {"a": lambda: time.sleep(0.001), "b": lambda: time.sleep(0.002)}
    timings = measure_interleaved(calls, 0.2)
    for timing in timings.values():
        assert len(timing.rounds_s) == SLICES >= 5
        assert sum(len(r) for r in timing.rounds_s) == len(timing.latencies_s)
    assert timings["b"].round_medians_s[0] > timings["a"].round_medians_s[0]
    assert spread([10.0, 12.0, 11.0]) == pytest.approx(2.0 / 11.0)


def row(runtime: str, rounds_ms: list[float], busy: float = 0.0) -> BenchRow:
    """A row timed with one run per round, at those latencies."""
    rounds = [[ms / 1e3] for ms in rounds_ms]
    case = Case(0, "opt", {"x": np.zeros((1, 4))})
    return timed_row(runtime, runtime, case,
                     Timing([r[0] for r in rounds], sum(rounds_ms) / 1e3, rounds), busy)


def test_a_row_whose_rounds_disagree_flags_its_ratios() -> None:
    pytorch = row("pytorch", [40.0, 41.0, 500.0, 39.0, 40.0])  # one round 12x slower
    served = row("served", [4.0, 4.1, 4.0, 3.9, 4.0])
    add_speedups([pytorch, served])
    assert pytorch.unreliable.startswith("its median moved")
    assert served.unreliable == ""
    assert served.speedup_vs_pytorch is not None
    assert served.speedup_unreliable.startswith("PyTorch row: its median moved")
    cards = speedup_cards([_served(10.0, served.speedup_unreliable)])
    assert cards == [("unreliable", "served vs PyTorch: the timings were unstable (benchmark)")]
    steady = [_served(2.0, ""), _served(38.0, "PyTorch row: x")]
    assert speedup_cards(steady) == [("2.00–2.00×", "served vs PyTorch (1 unstable corner "
                                                     "left out)")]


def _served(speedup: float, unreliable: str) -> BenchRow:
    return BenchRow("served", "served", 0, "opt", "x=1x4", 1, speedup_vs_pytorch=speedup,
                    speedup_unreliable=unreliable)


def test_the_load_of_other_processes_is_measured() -> None:
    before = CpuSample(0.0, 100.0, 10.0)
    cores = os.cpu_count() or 1
    # in 2 s, the machine was busy 2 * cores * 0.6 CPU-seconds, 0.2 * cores of them ours
    after = CpuSample(2.0, 100.0 + 1.2 * cores, 10.0 + 0.4 * cores)
    assert others_cpu_share(before, after) == pytest.approx(0.4)
    assert row("served", [1.0] * 5, busy=0.4).unreliable.startswith("other processes used 40%")


def _spin(seconds: float) -> None:
    os.nice(19)  # the lowest priority: the load the bench must see, taken from idle cores
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.fixture
def busy_machine() -> Iterator[None]:
    """Every core kept busy by another process (a real load, not a mock), at the lowest
    priority: the bench (one thread) still measures the others' share of the machine, while
    the tests of another pytest-xdist worker keep their core."""
    hogs = [multiprocessing.get_context("spawn").Process(target=_spin, args=(120,))
            for _ in range(os.cpu_count() or 1)]
    for hog in hogs:
        hog.start()
    time.sleep(0.5)
    yield
    for hog in hogs:
        hog.kill()
        hog.join()


def test_bench_through_the_cli_says_its_policy_and_spread(tiny_copy: Path) -> None:
    result = bench_cli(str(tiny_copy), "--seconds", "0.2", "--no-pytorch")
    assert result.returncode == 0, result.stderr
    assert "threads: passive:" in result.stdout and "OMP_WAIT_POLICY=PASSIVE" in result.stdout
    assert "in 5 rounds taken in rotation" in result.stdout and "spread" in result.stdout
    bench = json.loads((tiny_copy / "report.json").read_text())["benchmark"]
    assert bench["thread_policy"].startswith("passive")
    measured = [r for r in bench["rows"] if r["status"] == "ok"]
    assert measured and all(r["rounds"] == 5 and r["spread"] >= 0 for r in measured)


def test_bench_on_a_busy_machine_flags_rows_in_terminal_and_page(
        tiny_copy: Path, busy_machine: None) -> None:
    result = bench_cli(str(tiny_copy), "--seconds", "0.2", "--threads", "1")
    assert result.returncode == 0, result.stderr
    bench = json.loads((tiny_copy / "report.json").read_text())["benchmark"]
    flagged = [r for r in bench["rows"] if r["status"] == "ok" and r["unreliable"]]
    assert flagged, f"others' CPU share stayed under {BUSY_SHARE}: {bench['rows']}"
    assert any("other processes used" in r["unreliable"] for r in flagged)
    served = [r for r in bench["rows"] if r["runtime"] == "served"]
    assert all(r["speedup_unreliable"] for r in served)
    text = " ".join(result.stdout.split())
    assert "not to be trusted, nor any ratio against it" in text
    assert "x?" in text  # the ratio marked in the table
    page = (tiny_copy / "report.html").read_text()
    assert "served vs PyTorch: the timings were unstable" in page
    assert "× served vs PyTorch" not in page.replace("</b><span>", " ")
    assert "its figures and every ratio against it are not to be trusted" in page
