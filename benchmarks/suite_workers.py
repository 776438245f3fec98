"""The test suite (or a part of it) in one process and in pytest-xdist workers, back to
back, alternating: wall time, the CPU seconds of pytest and every process it waited for, and
the machine's idle CPU seconds while it ran (what a further worker could have used).

    .venv/bin/python benchmarks/suite_workers.py tests/cli            # one process vs -n 2
    .venv/bin/python benchmarks/suite_workers.py tests/stages --rounds 2
    .venv/bin/python benchmarks/suite_workers.py tests/serving --workers 2,3

Each run is ``pytest -q -p no:cacheprovider PATHS`` with, for N workers,
``-n N --dist loadgroup`` (``make test`` runs 2; 0 is one process). Read the figures only
against each other from one invocation: the machine's other load changes them all."""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path


def mode(workers: int) -> tuple[str, list[str]]:
    return ("one process", []) if workers == 0 else \
        (f"-n {workers}", ["-n", str(workers), "--dist", "loadgroup"])


def idle_s() -> float:
    """The machine's idle CPU seconds since boot (idle + iowait, ``/proc/stat``)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return (int(fields[3]) + int(fields[4])) / os.sysconf("SC_CLK_TCK")


def run(paths: list[str], extra: list[str]) -> tuple[float, float, float, str]:
    """Wall seconds, CPU seconds (user + system of pytest and its children), the machine's
    idle CPU seconds meanwhile, pytest's last line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    idle_before = idle_s()
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *extra, *paths], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [line for line in done.stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    return wall, cpu, idle_s() - idle_before, lines[-1] if lines else done.stdout[-300:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", default="0,2",
                        help="worker counts to compare, comma-separated (0: one process)")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the start")
    for round_ in range(args.rounds):
        modes = [mode(int(w)) for w in args.workers.split(",")]
        if round_ % 2:
            modes.reverse()
        for name, extra in modes:
            wall, cpu, idle, last = run(args.paths, extra)
            print(f"round {round_ + 1} {name:12s} {wall:7.1f} s wall {cpu:7.1f} s CPU "
                  f"{idle:7.1f} s idle (load {os.getloadavg()[0]:.1f})  {last}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
