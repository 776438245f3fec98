"""pytest plugin: CPU seconds per test (setup + call + teardown), this process and the child
processes it waited for (``getrusage`` SELF + CHILDREN), written as a TSV, largest first.

On a shared machine wall time says how busy the others are; CPU seconds say what a test costs.
Run a folder in one process (``-n`` would split the children's time across workers):

    nice -n 10 .venv/bin/python -m pytest -q -p benchmarks.cpu_per_test \\
        --cpu-times=cpu-stages.tsv tests/stages

Columns: cpu_s (user+system), wall_s, nodeid. A child that outlives its test (a server a
module fixture stops later) is counted in the test that waits for it."""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any

import pytest

_times: dict[str, list[float]] = {}


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-times", default=None, help="write CPU seconds per test to this TSV")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Any:
    cpu0, wall0 = _cpu(), time.perf_counter()
    yield
    row = _times.setdefault(item.nodeid, [0.0, 0.0])
    row[0] += _cpu() - cpu0
    row[1] += time.perf_counter() - wall0


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    path = config.getoption("--cpu-times")
    rows = sorted(_times.items(), key=lambda kv: -kv[1][0])
    total = sum(v[0] for v in _times.values())
    wall = sum(v[1] for v in _times.values())
    if path:
        Path(path).write_text("".join(f"{c:.2f}\t{w:.2f}\t{n}\n" for n, (c, w) in rows))
    terminalreporter.write_line(f"CPU seconds: {total:.1f} over {len(rows)} tests "
                                f"(wall {wall:.1f} s)")
    for nodeid, (cpu, w) in rows[:15]:
        terminalreporter.write_line(f"  {cpu:7.1f} CPU-s {w:7.1f} s  {nodeid}")
