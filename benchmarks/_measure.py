"""Shared by the benchmark scripts: run a command, sample its process tree's RSS."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import psutil


@dataclass
class Measured:
    seconds: float
    peak_mb: float
    returncode: int
    stdout: str
    stderr: str
    # user + system CPU seconds of the command's process tree (its reaped descendants): what
    # load on shared cores inflates far less than wall time
    cpu_seconds: float = 0.0


def run_measured(cmd: list[str], *, env: dict[str, str | None] | None = None,
                 cwd: str | None = None, interval: float = 0.05) -> Measured:
    """Wall time, CPU seconds and peak RSS (the process and all its children, summed) of a
    command (CPU seconds: call it from one thread at a time). ``env``: variables to set on
    top of this process's, a None value removes one."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    merged = {**os.environ, **(env or {})}
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={k: v for k, v in merged.items() if v is not None}, cwd=cwd)
    ps = psutil.Process(proc.pid)
    peak = 0.0
    while proc.poll() is None:
        try:
            total = ps.memory_info().rss + sum(
                c.memory_info().rss for c in ps.children(recursive=True))
            peak = max(peak, total / 2**20)
        except psutil.Error:
            pass
        time.sleep(interval)
    stdout, stderr = proc.communicate()
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return Measured(seconds, peak, proc.returncode, stdout, stderr, round(cpu, 2))


def machine() -> dict[str, Any]:
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "load_average_at_start": os.getloadavg()[0],
    }
