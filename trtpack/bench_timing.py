"""How ``trtpack bench`` times: warm-up, then runtimes in rotation within a time budget;
and the machine the numbers were taken on."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtpack.cases import Case
from trtpack.timing import RunOnce, Timing, measure_interleaved, warm_up

__all__ = ["ProgressFn", "RunOnce", "Runner", "Timing", "machine_info", "measure_interleaved",
           "warm_up"]

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


Runner = Callable[[Case], RunOnce]  # a runtime, prepared for one case's inputs
