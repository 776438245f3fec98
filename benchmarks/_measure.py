"""Shared by the benchmark scripts: run a command, sample its process tree's RSS; make the
job INT8's precision stage quantizes."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
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


def self_usage() -> tuple[float, float]:
    """This process's CPU seconds (user + system) and a wall clock (``time.perf_counter``):
    the difference of two readings is what a step in between cost."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime, time.perf_counter()


def machine() -> dict[str, Any]:
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "load_average_at_start": os.getloadavg()[0],
    }


@dataclass
class Int8Inputs:
    """What INT8's precision stage quantizes: the simplified FP32 graph and the calibration
    batches (``save_feeds``), with the batches' shapes (``8x128``...)."""

    graph: Path
    calibration: Path
    batch_shapes: list[str]


def int8_inputs(model: str, profile: str, work: Path, build: Path | None = None) -> Int8Inputs:
    """The job INT8's precision stage quantizes, made as the stage makes it, in ``work``
    (emptied first): the simplified FP32 graph of MODEL (``build``, a finished build folder
    of it, or one built here with ``--precision fp32 --target g5 --no-engine
    --random-weights``), copied out of the build (its files may be hard links into the
    cache), and its calibration batches (trtpack's default text, the recipe's sample count
    and seed) saved as ``calibration.npz``."""
    import shutil
    import sys

    from trtpack.api import BuildRequest, resolve_options
    from trtpack.precision.calibration.data import graph_vocab_size, load_calibration, save_feeds
    from trtpack.precision.calibration.text_batches import json_tokenizer

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out = build or work / "fp32"
    if build is None:
        subprocess.run([sys.executable, "-m", "trtpack.cli", "build", model, "--precision",
                        "fp32", "--target", "g5", "--no-engine", "--random-weights",
                        "--profile", profile, "--out", str(out), "--no-cache"], check=True)
    graph = out / "artifacts" / "simplify" / "model.onnx"
    source = work / "source"
    source.mkdir()
    for f in graph.parent.iterdir():
        if f.name.startswith(graph.name):
            shutil.copyfile(f, source / f.name)
    plan, _ = resolve_options(BuildRequest(model, precision="int8", target="g5",
                                           build_engine=False, random_weights=True,
                                           profiles=[profile]))
    settings = plan.recipe.precision_options.int8
    cal = load_calibration(plan.recipe, plan.profiles, None,
                           tokenizer=json_tokenizer(out / "artifacts" / "export" / "tokenizer"),
                           max_samples=settings.max_calibration_samples, seed=plan.seed,
                           vocab_size=graph_vocab_size(source / "model.onnx", plan.recipe))
    calibration = work / "calibration.npz"
    save_feeds(calibration, cal.feeds)
    shapes = sorted({"x".join(map(str, next(iter(f.values())).shape)) for f in cal.feeds})
    print(f"{len(cal.feeds)} calibration batches ({', '.join(shapes)})", flush=True)
    return Int8Inputs(source / "model.onnx", calibration, shapes)
