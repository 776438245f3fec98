"""What ``trtpack bench`` adds to the core timing (``trtpack.timing``: warm-up, then runtimes
in rotation within a time budget): when a ratio is not to be trusted, and the machine the
numbers were taken on."""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trtpack.cases import Case
from trtpack.report import MachineInfo
from trtpack.timing import RunOnce

# A ratio against a row is not to be trusted when that row's median moved more than this
# between the rounds (``Timing.spread``), or when other processes used more than this share
# of the machine's CPU time while the corner was timed.
UNSTABLE_SPREAD = 0.20
BUSY_SHARE = 0.25
THREAD_POLICY = "passive"  # no runtime spins its idle threads while another one runs


def passive_threads() -> str | None:
    """Ask PyTorch's OpenMP pool not to spin (``OMP_WAIT_POLICY=PASSIVE``, read when torch
    loads), as ONNX Runtime's sessions here do not (``allow_spinning=0``): the runtimes take
    turns on the same cores, and a spinning idle pool slows the next. A note when torch was
    loaded already with another policy (None when the policy holds)."""
    if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":
        return None
    if "torch" in sys.modules:
        return ("PyTorch was loaded before the benchmark set OMP_WAIT_POLICY=PASSIVE: its "
                "OpenMP threads may spin (policy "
                f"{os.environ.get('OMP_WAIT_POLICY') or 'default'})")
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return None


@dataclass(frozen=True)
class CpuSample:
    """The machine's busy CPU seconds and this process's, at one moment."""

    at: float
    machine_busy_s: float
    own_s: float

    @classmethod
    def now(cls) -> CpuSample:
        import psutil

        times = psutil.cpu_times()
        idle = times.idle + getattr(times, "iowait", 0.0)
        own = psutil.Process().cpu_times()
        return cls(time.monotonic(), sum(times) - idle, own.user + own.system)


def others_cpu_share(before: CpuSample, after: CpuSample) -> float:
    """The share of the machine's CPU time that other processes used between two samples
    (0 to 1): what the benchmark's own numbers had to share the cores with."""
    wall = after.at - before.at
    cores = os.cpu_count() or 1
    if wall <= 0:
        return 0.0
    others = (after.machine_busy_s - before.machine_busy_s) - (after.own_s - before.own_s)
    return min(1.0, max(0.0, others / (wall * cores)))

ProgressFn = Callable[[str], None]  # progress messages, shown by the CLI as a status line


def machine_info() -> MachineInfo:
    """CPU model and cores, memory, GPU name (when there is one), load average."""
    import psutil

    from trtpack.machine.gpus import detect_gpu

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
