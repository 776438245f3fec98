"""Measure what a build produced: latency and throughput at every profile corner.

For each profile's min/opt/max shape, on the inputs the export stage recorded (real tokenized
text when the recipe has a tokenizer), three runtimes are timed the same way (warm-up, then
as many runs as fit in a fixed time budget; ``trtpack.timing``):

* ``served``: the served model in its own runtime: ONNX Runtime for ``--target cpu``, the
  TensorRT engine (through ``trtpack.runtimes.tensorrt``, as the engine stage runs it) on a
  GPU target;
* ``onnx-fp32``: the FP32 ONNX (the verify stage's model) in ONNX Runtime;
* ``cpu-fp32``: the FP32 graph fused for ONNX Runtime (``trtpack.stages.cpu_model``), when
  the build made one and serves something else (an INT8 build: both forms side by side);
* ``pytorch``: PyTorch eager, loaded from the build's recipe as the export stage loads it.

Served throughput through a running Triton (perf_analyzer) is in ``trtpack.bench.served``.
The result goes into ``report.json`` (``benchmark``); the library never prints.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from trtpack.bench.runners import (
    check_runtime,
    onnxruntime_runner,
    pytorch_runner,
    pytorch_skip_reason,
    tensorrt_runner,
)
from trtpack.bench.timing import (
    BUSY_SHARE,
    THREAD_POLICY,
    UNSTABLE_SPREAD,
    CpuSample,
    ProgressFn,
    Runner,
    machine_info,
    others_cpu_share,
    passive_threads,
)
from trtpack.cases import Case, load_cases
from trtpack.errors import UserInputError
from trtpack.out_files import record_files
from trtpack.pipeline.build_folder import open_build
from trtpack.report import REPORT, BenchmarkResult, BenchRow, BuildReport, ServedResult
from trtpack.timing import Timing, measure_interleaved, seconds_from_environment

SERVED, ONNX_FP32, CPU_FP32, PYTORCH = "served", "onnx-fp32", "cpu-fp32", "pytorch"
DEFAULT_SECONDS = 2.0
# the time budget per row when --seconds is not given (a CI job that benches only to see that
# bench works sets it small; the test suite does)
SECONDS_ENV = "TRTPACK_BENCH_SECONDS"


def default_seconds() -> float:
    """``--seconds`` when it is not given: ``$TRTPACK_BENCH_SECONDS``, else 2; a value that is
    not a positive number is bad input."""
    return seconds_from_environment(SECONDS_ENV, DEFAULT_SECONDS)



def _batch(case: Case) -> int:
    first = next(iter(case.inputs.values()))
    return int(first.shape[0]) if first.ndim else 1


def timed_row(runtime: str, engine: str, case: Case, timing: Timing, busy: float) -> BenchRow:
    """A measured row; ``busy``: the share of the CPU other processes used meanwhile. Flagged
    ``unreliable`` when its rounds disagree or the machine was busy."""
    ms = np.asarray(timing.latencies_s) * 1e3
    batch = _batch(case)
    reasons = []
    if timing.spread > UNSTABLE_SPREAD:
        reasons.append(f"its median moved {timing.spread:.0%} between the "
                       f"{len(timing.rounds_s)} rounds")
    if busy > BUSY_SHARE:
        reasons.append(f"other processes used {busy:.0%} of the CPU while it was timed")
    return BenchRow(
        runtime, engine, case.profile, case.corner, case.shapes, batch,
        iterations=len(ms), p50_ms=float(np.percentile(ms, 50)),
        p90_ms=float(np.percentile(ms, 90)), p99_ms=float(np.percentile(ms, 99)),
        mean_ms=float(ms.mean()), throughput=batch * len(ms) / timing.elapsed_s,
        rounds=len(timing.rounds_s), spread=round(timing.spread, 4),
        unreliable="; ".join(reasons),
    )


def _not_run(runtime: str, engine: str, case: Case, status: str, reason: str) -> BenchRow:
    return BenchRow(runtime, engine, case.profile, case.corner, case.shapes, _batch(case),
                    status=status, reason=reason)


def run_benchmark(out: Path, *, seconds: float = DEFAULT_SECONDS, threads: int | None = None,
                  pytorch: bool = True, progress: ProgressFn | None = None) -> BenchmarkResult:
    """Time the served model, the FP32 ONNX and PyTorch eager at every profile corner, the
    three in rotation at each corner (``measure_interleaved``)."""
    if not seconds > 0:
        raise UserInputError(f"--seconds must be positive, not {seconds}")
    if threads is not None and threads < 1:
        raise UserInputError(f"--threads must be 1 or more, not {threads}")
    say = progress or (lambda message: None)
    build = open_build(out)
    check_runtime(build)
    threads = threads or os.cpu_count() or 1
    policy_note = passive_threads()  # before PyTorch loads
    device = "cuda" if build.is_engine else "cpu"
    cases = load_cases(build.reference)
    precision = build.report.precision
    result = BenchmarkResult(seconds, threads, device, machine_info(),
                             measured_at=dt.datetime.now(dt.timezone.utc)
                             .isoformat(timespec="seconds"))
    result.thread_policy = (
        f"{THREAD_POLICY}: {threads} thread(s) per runtime, none spinning while idle "
        "(ONNX Runtime allow_spinning=0, PyTorch OMP_WAIT_POLICY=PASSIVE)")
    if policy_note is not None:
        result.notes.append(policy_note)
    skip = "not asked for (--no-pytorch)" if not pytorch else pytorch_skip_reason(build)
    with ExitStack() as stack:
        runtimes: list[tuple[str, str, Runner]] = []
        if build.is_engine:
            runtimes.append((SERVED, f"served: TensorRT {precision}", tensorrt_runner(
                build.served_model, {c.profile for c in cases}, stack)))
            result.notes.append("TensorRT rows: this code path has not run on a GPU yet")
        else:
            runtimes.append((SERVED, f"served: ONNX Runtime {precision}",
                             onnxruntime_runner(build.served_model, threads)))
        runtimes.append((ONNX_FP32, "FP32 ONNX in ONNX Runtime",
                         onnxruntime_runner(build.fp32_onnx, threads)))
        cpu_fp32 = build.cpu_fp32_onnx
        if cpu_fp32 is not None and precision != "fp32" and not build.is_engine:
            runtimes.append((CPU_FP32, "FP32 ONNX fused for ONNX Runtime",
                             onnxruntime_runner(cpu_fp32, threads)))
        if skip is None:
            runtimes.append((PYTORCH, f"PyTorch eager ({device})",
                             pytorch_runner(build, threads, device, stack, say)))
        for case in cases:
            say(f"p{case.profile} {case.corner} ({case.shapes}): "
                + ", ".join(label for _, label, _ in runtimes))
            calls = {name: prepare(case) for name, _, prepare in runtimes}
            before = CpuSample.now()
            timings = measure_interleaved(calls, seconds)
            busy = others_cpu_share(before, CpuSample.now())
            result.rows += [timed_row(name, label, case, timings[name], busy)
                            for name, label, _ in runtimes]
            if skip is not None:
                result.rows.append(_not_run(PYTORCH, "PyTorch eager", case, "skipped", skip))
    add_speedups(result.rows)
    return result


def add_speedups(rows: Sequence[BenchRow]) -> None:
    """``speedup_vs_pytorch`` on every measured row whose corner has a PyTorch row, and why
    that ratio is not to be trusted when either row is not (``speedup_unreliable``)."""
    baseline = {(r.profile, r.corner): r for r in rows
                if r.runtime == PYTORCH and r.status == "ok"}
    for r in rows:
        base = baseline.get((r.profile, r.corner))
        if r.status == "ok" and base is not None and base.p50_ms and r.p50_ms:
            r.speedup_vs_pytorch = base.p50_ms / r.p50_ms
            doubts = [f"{who} row: {row.unreliable}" for who, row in
                      (("PyTorch", base), ("this", r)) if row.unreliable]
            r.speedup_unreliable = "; ".join(dict.fromkeys(doubts)) if r is not base else ""


def save_benchmark(out: Path, result: BenchmarkResult | None = None,
                   served: ServedResult | None = None) -> BuildReport:
    """Store runtime rows and/or served results as report.json's ``benchmark`` section; what
    is not measured this time is kept from an earlier bench."""
    report = BuildReport.load(out / REPORT)
    section = dict(report.benchmark or {})
    if result is not None:
        section.update({k: v for k, v in result.to_dict().items() if k != "served"})
    if served is not None:
        section["served"] = asdict(served)
    report.benchmark = section
    report.save(out / REPORT)
    return report


@dataclass
class BenchOutcome:
    """What ``benchmark_build`` measured and the report it saved them in."""

    result: BenchmarkResult | None  # runtimes here; None with runtimes=False
    served: ServedResult | None  # through Triton; None without a served URL
    report: BuildReport


def benchmark_build(out: Path, *, seconds: float | None = None, threads: int | None = None,
                    pytorch: bool = True, runtimes: bool = True, served_url: str | None = None,
                    concurrency: Sequence[int] | None = None, compare_batching: bool = False,
                    corners: Sequence[str] | None = None,
                    progress: ProgressFn | None = None) -> BenchOutcome:
    """``trtpack bench``: the runtimes here (``run_benchmark``) and/or a running Triton
    (``bench.served.served_benchmark``), saved into report.json, and report.html rewritten.
    ``seconds``: per row (``default_seconds()`` when None)."""
    from trtpack.report_page.html import write_report_html

    if seconds is None:
        seconds = default_seconds()

    if compare_batching and served_url is None:
        raise UserInputError("--compare-batching needs --served URL")
    if not runtimes and served_url is None:
        raise UserInputError("--no-runtimes measures nothing without --served URL")
    if seconds <= 0:  # checked here too: before any server is contacted
        raise UserInputError(f"--seconds must be positive, not {seconds}")
    build = open_build(out)
    result = served = None
    if served_url is not None:
        from trtpack.bench.served import DEFAULT_CONCURRENCY, served_benchmark

        served = served_benchmark(build, served_url,
                                  concurrency=concurrency or DEFAULT_CONCURRENCY,
                                  seconds=seconds, compare_batching=compare_batching,
                                  corners=corners or ("min", "opt", "max"), progress=progress)
    if runtimes:
        result = run_benchmark(out, seconds=seconds, threads=threads, pytorch=pytorch,
                               progress=progress)
    report = save_benchmark(out, result, served)
    page = write_report_html(out, report)
    record_files(out, [out / REPORT, page])  # a rebuild replaces them with the build's files
    return BenchOutcome(result, served, report)
