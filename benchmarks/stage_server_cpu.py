"""Test files with and without the stage server (``pipeline.stage_server``: stage processes
forked from templates that imported their packages once), alternating: the CPU seconds of
pytest and every process it waited for (the server's templates, monitors and the stage
processes they forked included: each waits for its children), and wall time.

    .venv/bin/python benchmarks/stage_server_cpu.py tests/pipeline/test_interrupt.py
    .venv/bin/python benchmarks/stage_server_cpu.py tests/test_readme.py --rounds 2 -n 2

Each run is ``pytest -q -p no:cacheprovider [-n N --dist loadgroup] PATHS`` in this
environment: with the server ``TRTPACK_TEST_STAGE_SERVER=1`` (the ``stage_server`` fixture
of ``tests/conftest.py`` starts one per pytest process), without it ``=0``. The order alternates
(on, off, off, on, ...). Read the figures only against each other from one invocation: the
machine's other load changes them all."""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time

STAGE_SERVER_ENV = "TRTPACK_STAGE_SERVER"  # trtpack.processes'
TEST_STAGE_SERVER_ENV = "TRTPACK_TEST_STAGE_SERVER"  # tests/conftest.py's switch


def run(paths: list[str], workers: int, server: bool) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system of pytest and what it waited for), pytest's
    last line."""
    env = {k: v for k, v in os.environ.items() if k != STAGE_SERVER_ENV}
    env[TEST_STAGE_SERVER_ENV] = "1" if server else "0"
    extra = ["-n", str(workers), "--dist", "loadgroup"] if workers else []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *extra, *paths], capture_output=True, text=True, check=False,
                          env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [line for line in done.stdout.splitlines()
             if re.search(r"\d+ (passed|failed)", line)]
    return wall, cpu, lines[-1] if lines else done.stdout[-300:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("-n", "--workers", type=int, default=0,
                        help="pytest-xdist workers (0: one process)")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the start; "
          f"{' '.join(args.paths)}")
    totals: dict[bool, list[float]] = {True: [], False: []}
    for round_ in range(args.rounds):
        order = (True, False) if round_ % 2 == 0 else (False, True)
        for server in order:
            wall, cpu, last = run(args.paths, args.workers, server)
            totals[server].append(cpu)
            print(f"round {round_ + 1} {'server   ' if server else 'no server'}: "
                  f"{cpu:7.1f} CPU-s {wall:7.1f} s wall  {last}", flush=True)
    on, off = sum(totals[True]), sum(totals[False])
    print(f"CPU-s, all rounds: server {on:.1f}, no server {off:.1f} "
          f"({(off - on) / max(off, 1e-9):.0%} less with the server)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
