"""What a warming stage process at a nicer autogroup leaves the export (issue 47,
``isolate.import_behind``): a busy stand-in for the export against three busy stand-ins for
warming stage processes, each in a session of its own as stage processes are, all on one
CPU; the stand-in's share of that CPU with the three at autogroup nice 0 and at nice 10,
alternating.

    python benchmarks/autogroup_share.py [--seconds 3] [--rounds 3] [--cpu N] [--json FILE]

Linux's autogroup scheduler shares a CPU equally among sessions whatever their processes'
nice values (``/proc/sys/kernel/sched_autogroup_enabled``, processes in the root cgroup):
at nice 0 the stand-in gets a quarter of the CPU (less on a loaded machine), at nice 10
about three quarters. Where autogroups are not in effect the two rows are about the same.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine

WARMING = 3
BUSY = """
import os, sys, time
os.sched_setaffinity(0, {cpu})
if {nice}:
    from trtpack.processes import set_autogroup_nice
    set_autogroup_nice({nice})
sys.stdin.readline()  # every process started: go
start = time.monotonic()
while time.monotonic() - start < {seconds}:
    pass
print(time.process_time())
"""


def shares(nice: int, seconds: float, cpu: int) -> dict[str, float | list[float]]:
    """The stand-in's CPU seconds over ``seconds`` (its share) beside ``WARMING`` busy
    processes at autogroup nice ``nice``, each process in its own session, all on ``cpu``."""

    def start(process_nice: int) -> subprocess.Popen[str]:
        code = BUSY.format(cpu={cpu}, nice=process_nice, seconds=seconds)
        return subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    warming = [start(nice) for _ in range(WARMING)]
    export = start(0)
    time.sleep(0.5)  # their imports and the nice values set
    for process in (*warming, export):
        assert process.stdin is not None
        process.stdin.write("\n")
        process.stdin.flush()
    export_cpu = float(export.communicate()[0])
    warming_cpu = [float(p.communicate()[0]) for p in warming]
    return {"nice": nice, "export_share": round(export_cpu / seconds, 2),
            "warming_cpu_s": [round(c, 2) for c in warming_cpu]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for index in range(args.rounds):
        for nice in ((0, 10) if index % 2 == 0 else (10, 0)):
            row = shares(nice, args.seconds, args.cpu)
            rows.append(row)
            print(json.dumps(row), flush=True)
    for nice in (0, 10):
        print(f"warming at autogroup nice {nice}: the export stand-in's share "
              + " / ".join(str(r["export_share"]) for r in rows if r["nice"] == nice))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": machine(), "command": " ".join(["python", *sys.argv]),
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "autogroup": Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
            if Path("/proc/sys/kernel/sched_autogroup_enabled").exists() else None,
            "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
