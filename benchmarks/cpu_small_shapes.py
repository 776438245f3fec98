"""trtpack's FP32 CPU model against Optimum's O2/O3 at small shapes, read in CPU time as well
as wall time (issue 47: on a loaded machine the anchor's 1x8 pair read 0.56-1.04).

    python benchmarks/cpu_anchor.py --work /tmp/anchor       # once: builds + Optimum's files
    python benchmarks/cpu_small_shapes.py /tmp/anchor [--corners 1x8,4x32] [--json FILE]

At a small shape a run is a few hundred microseconds of work spread over ~80 kernels on a
2-thread pool: on shared cores the wall time is mostly how long the pool's threads wait to
be scheduled, which moves with the load, not with the model. So each model is also timed by
the process's CPU time per run (``time.process_time``: every thread of this process, the
pool's included; with spinning off a waiting thread costs nothing), and with one intra-op
thread (no pool hand-offs), in rotation with the anchor's method (shuffled order each
rotation). The CPU time is what the model costs; the one-thread wall time is what a loaded
machine reads closest to it. ``--profile`` adds ONNX Runtime's per-node profile of each
model at the first corner: where the time of a small run goes, node by node (the kernels
the optimizations at load time left).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_anchor import commit, corner_inputs, machine


def make_session(path: Path, threads: int, profile_prefix: str | None = None) -> Any:
    """The anchor's session options (``cpu_anchor.session``), ``threads`` intra-op threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def rotation(calls: dict[str, Any], rounds: int, runs: int) -> dict[str, dict[str, float]]:
    """Per call: median over rotations of the rotation's median wall ms and its CPU ms per
    run (``runs`` runs per call per rotation, the calls in a shuffled order each rotation)."""
    for call in calls.values():
        for _ in range(5):
            call()
    wall: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, list[float]] = defaultdict(list)
    order = random.Random(0)
    names = list(calls)
    for _ in range(rounds):
        for name in order.sample(names, len(names)):
            call = calls[name]
            times = []
            c0 = time.process_time()
            for _ in range(runs):
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            cpu[name].append((time.process_time() - c0) / runs * 1000)
            wall[name].append(statistics.median(times) * 1000)
    return {name: {"wall_ms": round(statistics.median(wall[name]), 4),
                   "cpu_ms": round(statistics.median(cpu[name]), 4),
                   "wall_rounds": [round(x, 4) for x in wall[name]],
                   "cpu_rounds": [round(x, 4) for x in cpu[name]]} for name in names}


def node_profile(path: Path, feed: dict[str, Any], runs: int, folder: Path
                 ) -> dict[str, float]:
    """Microseconds per run by operator type (ONNX Runtime's profiler, one thread)."""
    session = make_session(path, 1, str(folder / path.parent.name))
    for _ in range(runs):
        session.run(None, feed)
    events = json.loads(Path(session.end_profiling()).read_text())
    by_op: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] += e["dur"] / runs
    return dict(sorted(((k, round(v, 1)) for k, v in by_op.items()), key=lambda kv: -kv[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, help="cpu_anchor.py's --work folder")
    parser.add_argument("--corners", default="1x8,4x32")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--runs", type=int, default=50, help="runs per model per rotation")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from _anchor_models import load_anchor_model, served_model

    optimum = json.loads((args.work / "optimum" / "optimum.json").read_text())
    paths = {"trtpack fp32": served_model(args.work / "fp32", "minilm"),
             "optimum O2": Path(optimum["files"]["optimum O2"]),
             "optimum O3": Path(optimum["files"]["optimum O3"])}
    anchor = load_anchor_model("minilm", args.work / "fp32", args.work)
    result: dict[str, Any] = {"machine": machine(), "commit": commit(),
                              "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "load_average_before": os.getloadavg(), "corners": {}}
    for corner in args.corners.split(","):
        batch, seq = (int(x) for x in corner.split("x"))
        feed = corner_inputs(anchor.tokenizer, batch, seq)
        calls = {}
        for threads in (2, 1):
            for name, path in paths.items():
                s = make_session(path, threads)
                names = {i.name for i in s.get_inputs()}
                f = {k: v for k, v in feed.items() if k in names}
                calls[f"{name}, {threads} thread{'s' if threads > 1 else ''}"] = \
                    (lambda s=s, f=f: s.run(None, f))
        found = rotation(calls, args.rounds, args.runs)
        result["corners"][corner] = found
        for name, r in found.items():
            print(f"{corner} {name}: wall {r['wall_ms']:.3f} ms, CPU {r['cpu_ms']:.3f} ms",
                  flush=True)
        if args.profile:
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                result.setdefault("profiles", {})[corner] = {
                    name: node_profile(path, {k: v for k, v in feed.items()
                                              if k in {i.name for i in make_session(
                                                  path, 1).get_inputs()}}, 200, Path(tmp))
                    for name, path in paths.items()}
            for name, ops in result["profiles"][corner].items():
                print(f"{corner} {name} (1 thread, us/run by op): {ops}", flush=True)
    result["load_average_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
