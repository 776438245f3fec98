"""The test suite (or a part of it) in one process and in two pytest-xdist workers, back to
back, alternating: wall time and the CPU seconds of pytest and every process it waited for.

    .venv/bin/python benchmarks/suite_workers.py tests/cli            # one round
    .venv/bin/python benchmarks/suite_workers.py tests/stages --rounds 2

Each run is ``pytest -q -p no:cacheprovider PATHS`` with, for the workers,
``-n 2 --dist loadgroup`` (what ``make test`` runs). Read the figures only against each other
from one invocation: the machine's other load changes both."""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time

MODES = {"one process": [], "-n 2": ["-n", "2", "--dist", "loadgroup"]}


def run(paths: list[str], extra: list[str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system of pytest and its children), pytest's last
    line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *extra, *paths], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [line for line in done.stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    return wall, cpu, lines[-1] if lines else done.stdout[-300:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the start")
    for round_ in range(args.rounds):
        modes = list(MODES.items())
        if round_ % 2:
            modes.reverse()
        for name, extra in modes:
            wall, cpu, last = run(args.paths, extra)
            print(f"round {round_ + 1} {name:12s} {wall:7.1f} s wall {cpu:7.1f} s CPU "
                  f"(load {os.getloadavg()[0]:.1f})  {last}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
