"""CPU-seconds of a build, process by process (issue 47): what a loaded machine inflates far
less than wall time.

    python benchmarks/build_cpu.py [--rounds N] [--variant NAME:VAR=VALUE,...]... \
        [--json FILE] -- trtpack build ... --out OUT

Runs the command (``--rounds`` times; with ``--variant``s, each round runs every variant in
turn, alternating, so an A/B comparison shares the machine's load), samples its process tree
every ``--interval`` seconds and keeps each process's last user + system CPU seconds (its
own): a stage process (``python -m trtpack.pipeline.isolate``) is named
by its stage, the build's own process ``build``, anything else by its command. The total is
the tree's exact figure (``RUSAGE_CHILDREN``); a process's figure misses at most its last
``--interval``, and ``(not sampled)`` is the rest (those last intervals, processes that
lived less than one). An ``OUT`` in the command gets the variant's name and the round appended.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine

ISOLATE = "trtpack.pipeline.isolate"


def label(cmdline: list[str], root: int, pid: int) -> str:
    """What a process of the build is: its stage, the build, or its command."""
    if pid == root:
        return "build"
    if ISOLATE in cmdline:
        rest = cmdline[cmdline.index(ISOLATE) + 1:]
        return f"stage {rest[2]}" if len(rest) > 2 else "stage ?"
    joined = " ".join(Path(cmdline[0]).name if i == 0 else part
                      for i, part in enumerate(cmdline[:4])) if cmdline else "?"
    return joined[:80]


def run_once(cmd: list[str], env: dict[str, str], interval: float) -> dict[str, Any]:
    """One run of ``cmd``: wall, the tree's CPU seconds, per process and per label."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen: dict[int, dict[str, Any]] = {}
    handles: dict[int, psutil.Process] = {}
    peak = 0.0
    while proc.poll() is None:
        try:
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.Error:
            tree = []
        rss = 0.0
        for p in tree:
            try:
                key = p.pid
                if key not in handles:
                    handles[key] = p
                    seen[key] = {"label": label(p.cmdline(), proc.pid, p.pid),
                                 "parent": p.ppid(),
                                 "start_s": round(p.create_time() - time.time()
                                                  + time.perf_counter() - started, 2)}
                t = p.cpu_times()
                seen[key]["cpu_s"] = round(t.user + t.system, 2)
                seen[key]["last_s"] = round(time.perf_counter() - started, 2)
                rss += p.memory_info().rss
            except psutil.Error:
                continue
        peak = max(peak, rss / 2**20)
        time.sleep(interval)
    output = proc.communicate()[0]
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    by_label: dict[str, float] = {}
    for rec in seen.values():
        by_label[rec["label"]] = round(by_label.get(rec["label"], 0.0) + rec.get("cpu_s", 0), 2)
    # short-lived processes the sampling missed, and each process's last interval
    by_label["(not sampled)"] = round(total - sum(by_label.values()), 2)
    return {"returncode": proc.returncode, "wall_s": round(wall, 1),
            "cpu_s": round(total, 1), "peak_mb_sampled": round(peak),
            "by_label": by_label, "processes": seen, "output_tail": output[-2000:]}


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, assigns = text.partition(":")
    env = dict(a.split("=", 1) for a in assigns.split(",") if a)
    return name, env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME:VAR=VALUE,... environment of one variant (default: one, "
                             "the environment as it is)")
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    variants = [parse_variant(v) for v in args.variant] or [("as-is", {})]
    out_at = cmd.index("--out") + 1 if "--out" in cmd else None
    runs = []
    for round_ in range(args.rounds):
        for name, env in variants:
            this = list(cmd)
            if out_at is not None:
                this[out_at] = f"{cmd[out_at]}-{name}-{round_}"
            record = run_once(this, env, args.interval)
            record.update({"variant": name, "round": round_, "env": env,
                           "load_average": os.getloadavg()})
            runs.append(record)
            print(f"{name} round {round_}: rc {record['returncode']}, wall "
                  f"{record['wall_s']} s, CPU {record['cpu_s']} s, load "
                  f"{record['load_average'][0]:.1f}; " + ", ".join(
                      f"{k} {v}" for k, v in sorted(record["by_label"].items(),
                                                     key=lambda kv: -kv[1])), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": machine(), "measured_at": time.strftime("%Y-%m-%d %H:%M UTC",
                                                               time.gmtime()),
            "command": cmd, "runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
