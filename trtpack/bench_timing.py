"""How ``trtpack bench`` times: warm-up, then runtimes in rotation within a time budget;
and the machine the numbers were taken on."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtpack.cases import Case

WARMUP_RUNS = 3
ProgressFn = Callable[[str], None]  # progress messages, shown by the CLI as a status line


def machine_info() -> dict[str, Any]:
    """CPU model and cores, memory, GPU name (when there is one), load average."""
    import psutil

    from trtpack.machine import detect_gpu

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = detect_gpu()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "cpu": cpu, "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "gpu": gpu.name if gpu is not None else None,
        "gpu_driver": gpu.driver if gpu is not None else None,
        "load_average": [round(x, 2) for x in load],
        "python": platform.python_version(), "platform": platform.platform(terse=True),
    }


@dataclass(frozen=True)
class Timing:
    latencies_s: list[float]
    elapsed_s: float


RunOnce = Callable[[], object]  # one inference; returns when its results are ready
Runner = Callable[[Case], RunOnce]  # a runtime, prepared for one case's inputs
SLICES = 5


def warm_up(run_once: RunOnce, seconds: float, warmup_runs: int = WARMUP_RUNS) -> None:
    """``warmup_runs`` calls and at least a fifth of the budget (up to a second)."""
    warm_until = time.perf_counter() + min(1.0, seconds / 5)
    runs = 0
    while runs < warmup_runs or time.perf_counter() < warm_until:
        run_once()
        runs += 1


def measure_interleaved(calls: Mapping[str, RunOnce], seconds: float,
                        slices: int = SLICES) -> dict[str, Timing]:
    """Time each call back to back for ``seconds`` in all, after warm-up. The budget is cut
    into ``slices`` turns taken in rotation (A B C A B C …), so that load from elsewhere on
    the machine falls on every runtime alike and their ratio stays meaningful; every call
    runs at least once per turn."""
    for run_once in calls.values():
        warm_up(run_once, seconds)
    latencies: dict[str, list[float]] = {name: [] for name in calls}
    elapsed = dict.fromkeys(calls, 0.0)
    turn = seconds / slices
    for _ in range(slices):
        for name, run_once in calls.items():
            started = time.perf_counter()
            while True:
                t0 = time.perf_counter()
                run_once()
                latencies[name].append(time.perf_counter() - t0)
                if time.perf_counter() - started >= turn:
                    break
            elapsed[name] += time.perf_counter() - started
    return {name: Timing(latencies[name], elapsed[name]) for name in calls}
