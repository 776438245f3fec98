"""Measure what a build produced: latency and throughput at every profile corner.

For each profile's min/opt/max shape, on the inputs the export stage recorded (real tokenized
text when the recipe has a tokenizer), three runtimes are timed the same way (warm-up, then
as many runs as fit in a fixed time budget):

* ``served``: the served model in its own runtime: ONNX Runtime for ``--target cpu``, the
  TensorRT engine (through ``trtpack.engine.tensorrt_api``, as the engine stage runs it) on a
  GPU target;
* ``onnx-fp32``: the FP32 ONNX (the verify stage's model) in ONNX Runtime;
* ``pytorch``: PyTorch eager, loaded from the build's recipe as the export stage loads it.

Served throughput through a running Triton (perf_analyzer) is in ``trtpack.bench_served``.
The result goes into ``report.json`` (``benchmark``); the library never prints.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trtpack.cases import Case, load_cases
from trtpack.errors import MissingEnvironmentError, UserInputError, require_modules
from trtpack.report import REPORT, BuildReport
from trtpack.serving.repository import REPOSITORY

RECIPE = "recipe.yaml"
# the recorded inputs: the export stage's, or the import stage's for an ONNX file given as MODEL
REFERENCES = (Path("artifacts") / "export" / "reference.npz",
              Path("artifacts") / "import" / "reference.npz")
FP32_ONNX = Path("artifacts") / "simplify" / "model.onnx"
SERVED, ONNX_FP32, PYTORCH = "served", "onnx-fp32", "pytorch"
DEFAULT_SECONDS = 2.0
WARMUP_RUNS = 3

ProgressFn = Callable[[str], None]


@dataclass
class BenchRow:
    """One runtime timed at one profile corner. Latencies in milliseconds per request
    (a request is one batch of the corner's shape); throughput in samples per second."""

    runtime: str  # served / onnx-fp32 / pytorch / triton
    engine: str  # what ran: "onnxruntime fp32", "tensorrt fp16", "pytorch eager cpu", ...
    profile: int
    corner: str
    shapes: str
    batch: int
    status: str = "ok"  # ok / skipped / unrun
    reason: str = ""
    iterations: int = 0
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    mean_ms: float | None = None
    throughput: float | None = None  # samples per second
    speedup_vs_pytorch: float | None = None  # pytorch p50 / this p50, same corner


@dataclass
class BenchmarkResult:
    """The ``benchmark`` section of report.json."""

    seconds_per_row: float
    threads: int
    device: str  # cpu / cuda
    machine: dict[str, Any]
    rows: list[BenchRow] = field(default_factory=list)
    measured_at: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchmarkResult:
        data = dict(data)
        rows = [BenchRow(**r) for r in data.pop("rows", [])]
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known, rows=rows)


def machine_info() -> dict[str, Any]:
    """CPU model and cores, memory, GPU name (when there is one), load average."""
    import psutil

    from trtpack.gpu import detect_gpu

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


# --- the build folder ------------------------------------------------------------------------

@dataclass(frozen=True)
class BuildFolder:
    """What bench needs from ``trtpack build``'s output folder."""

    root: Path
    report: BuildReport
    served_model: Path  # model.onnx or model.plan in the repository
    fp32_onnx: Path
    reference: Path

    @property
    def is_engine(self) -> bool:
        return self.served_model.suffix == ".plan"

    @property
    def recipe_path(self) -> Path:
        return self.root / RECIPE


def load_build_report(out: Path) -> BuildReport:
    """The report of the trtpack build folder ``out`` (finished or not);
    ``UserInputError`` (exit 2) when ``out`` is not one."""
    report_path = out / REPORT
    if not report_path.is_file():
        raise UserInputError(f"'{out}' is not a trtpack build folder: it has no {REPORT}")
    try:
        return BuildReport.load(report_path)
    except (ValueError, TypeError, KeyError) as e:
        raise UserInputError(f"'{report_path}' is not a trtpack report ({e})") from None


def open_build(out: Path) -> BuildFolder:
    """Check that ``out`` is a finished trtpack build; ``UserInputError`` (exit 2) if not."""
    if not out.is_dir():
        raise UserInputError(f"'{out}' is not a folder (give the --out of a trtpack build)")
    report = load_build_report(out)
    if report.status != "ok":
        raise UserInputError(f"'{out}' is a build that did not finish ({report.status})")
    reference = next((out / p for p in REFERENCES if (out / p).is_file()), None)
    missing = [str(p) for p in (FP32_ONNX,) if not (out / p).is_file()]
    if reference is None:
        missing.append(f"{REFERENCES[0]} (or {REFERENCES[1]})")
    repo = out / REPOSITORY / report.model / "1"
    served = next((repo / f for f in ("model.plan", "model.onnx") if (repo / f).is_file()), None)
    if served is None:
        missing.append(f"{REPOSITORY}/{report.model}/1/model.onnx or model.plan")
    if missing:
        raise UserInputError(f"'{out}' is not a complete trtpack build: missing "
                             + ", ".join(missing))
    assert served is not None and reference is not None
    return BuildFolder(out, report, served, out / FP32_ONNX, reference)


# --- timing ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Timing:
    latencies_s: list[float]
    elapsed_s: float


RunOnce = Callable[[], object]  # one inference; returns when its results are ready
Runner = Callable[[Case], RunOnce]  # a runtime, prepared for one case's inputs
SLICES = 5


def warm_up(run_once: RunOnce, seconds: float, warmup_runs: int = WARMUP_RUNS) -> None:
    """``warmup_runs`` calls and at least a fifth of the budget (up to a second)."""
    warm_until = time.perf_counter() + min(1.0, seconds / 5)
    runs = 0
    while runs < warmup_runs or time.perf_counter() < warm_until:
        run_once()
        runs += 1


def measure_interleaved(calls: Mapping[str, RunOnce], seconds: float,
                        slices: int = SLICES) -> dict[str, Timing]:
    """Time each call back to back for ``seconds`` in all, after warm-up. The budget is cut
    into ``slices`` turns taken in rotation (A B C A B C …), so that load from elsewhere on
    the machine falls on every runtime alike and their ratio stays meaningful; every call
    runs at least once per turn."""
    for run_once in calls.values():
        warm_up(run_once, seconds)
    latencies: dict[str, list[float]] = {name: [] for name in calls}
    elapsed = dict.fromkeys(calls, 0.0)
    turn = seconds / slices
    for _ in range(slices):
        for name, run_once in calls.items():
            started = time.perf_counter()
            while True:
                t0 = time.perf_counter()
                run_once()
                latencies[name].append(time.perf_counter() - t0)
                if time.perf_counter() - started >= turn:
                    break
            elapsed[name] += time.perf_counter() - started
    return {name: Timing(latencies[name], elapsed[name]) for name in calls}


def _caller(func: Callable[..., object], *args: object) -> RunOnce:
    return lambda: func(*args)


def _batch(case: Case) -> int:
    first = next(iter(case.inputs.values()))
    return int(first.shape[0]) if first.ndim else 1


def _row(runtime: str, engine: str, case: Case, timing: Timing) -> BenchRow:
    ms = np.asarray(timing.latencies_s) * 1e3
    batch = _batch(case)
    return BenchRow(
        runtime, engine, case.profile, case.corner, case.shapes, batch,
        iterations=len(ms), p50_ms=float(np.percentile(ms, 50)),
        p90_ms=float(np.percentile(ms, 90)), p99_ms=float(np.percentile(ms, 99)),
        mean_ms=float(ms.mean()), throughput=batch * len(ms) / timing.elapsed_s,
    )


def _not_run(runtime: str, engine: str, case: Case, status: str, reason: str) -> BenchRow:
    return BenchRow(runtime, engine, case.profile, case.corner, case.shapes, _batch(case),
                    status=status, reason=reason)


# --- runtimes --------------------------------------------------------------------------------

def onnxruntime_runner(model: Path, threads: int) -> Runner:
    from trtpack.runtimes.onnxruntime import cpu_session

    session = cpu_session(model, threads, inter_op_threads=1)
    names = {i.name for i in session.get_inputs()}

    def prepare(case: Case) -> RunOnce:
        return _caller(session.run, None, {k: v for k, v in case.inputs.items() if k in names})

    return prepare


def tensorrt_runner(engine_path: Path, profiles: set[int], stack: ExitStack) -> Runner:
    """NOT RUN on any GPU yet (no GPU or TensorRT where this was written): the engine through
    the runner the engine stage verifies it with, one execution context per profile."""
    from trtpack.engine import tensorrt_api

    engine = tensorrt_api.load_engine(engine_path)
    infers = {p: stack.enter_context(tensorrt_api.engine_runner(engine, p)) for p in profiles}

    def prepare(case: Case) -> RunOnce:
        infer = infers[case.profile]
        return _caller(infer, infer.feed(case.inputs))

    return prepare


def _load_recipe(build: BuildFolder) -> Any:
    import yaml

    from trtpack.recipe import Recipe
    from trtpack.resolve import resolve_model

    if build.recipe_path.is_file():
        return Recipe.model_validate(yaml.safe_load(build.recipe_path.read_text()))
    return resolve_model(build.report.model)  # a build from before recipe.yaml was written


def pytorch_skip_reason(build: BuildFolder) -> str | None:
    """Why PyTorch eager cannot be the baseline of this build (None when it can)."""
    export = build.report.stage("export")
    if export is None or export.status != "ok":
        return "the model did not come from PyTorch (no export stage): no eager baseline"
    try:
        require_modules({"torch": "torch", "transformers": "transformers"},
                        purpose="the PyTorch baseline", install="'trtpack[onnx]'")
    except MissingEnvironmentError as e:
        return str(e)
    return None


def pytorch_runner(build: BuildFolder, threads: int, device: str, stack: ExitStack,
                   progress: ProgressFn) -> Runner:
    """The recipe's model in PyTorch eager, loaded as the export stage loads it."""
    import torch

    from trtpack.models import load_model
    from trtpack.stages.export import output_selector

    recipe = _load_recipe(build)
    export = build.report.stage("export")
    random_weights = export is not None and export.metrics.get("weights") == "random"
    progress("loading the PyTorch model" + (" (random weights)" if random_weights else ""))
    torch.set_num_threads(threads)
    loaded = load_model(recipe, random_weights=random_weights)
    wrapper = output_selector(loaded.module, recipe).to(device)
    names = [i.name for i in recipe.inputs]
    stack.enter_context(torch.inference_mode())
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def prepare(case: Case) -> RunOnce:
        args = [torch.from_numpy(case.inputs[n]).to(device) for n in names]

        def run_once() -> None:
            wrapper(*args)
            sync()

        return run_once

    return prepare


def check_runtime(build: BuildFolder) -> None:
    """``MissingEnvironmentError`` (exit 3) when the served model's runtime is not here."""
    if build.is_engine:
        from trtpack.gpu import engine_environment
        from trtpack.targets import resolve_target

        env = engine_environment(resolve_target(build.report.target))
        if not env.ok:
            raise MissingEnvironmentError(
                f"cannot bench the TensorRT engine of '{build.root}' here: "
                + "; ".join(env.problems),
                hint="run trtpack bench on a GPU of the target's family with TensorRT (the "
                "NGC container)")
    require_modules({"onnxruntime": "onnxruntime"}, purpose="trtpack bench",
                    install="'trtpack[onnx]'")


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
    device = "cuda" if build.is_engine else "cpu"
    cases = load_cases(build.reference)
    precision = build.report.precision
    result = BenchmarkResult(seconds, threads, device, machine_info(),
                             measured_at=dt.datetime.now(dt.timezone.utc)
                             .isoformat(timespec="seconds"))
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
        if skip is None:
            runtimes.append((PYTORCH, f"PyTorch eager ({device})",
                             pytorch_runner(build, threads, device, stack, say)))
        for case in cases:
            say(f"p{case.profile} {case.corner} ({case.shapes}): "
                + ", ".join(label for _, label, _ in runtimes))
            timings = measure_interleaved({name: prepare(case)
                                           for name, _, prepare in runtimes}, seconds)
            result.rows += [_row(name, label, case, timings[name])
                            for name, label, _ in runtimes]
            if skip is not None:
                result.rows.append(_not_run(PYTORCH, "PyTorch eager", case, "skipped", skip))
    add_speedups(result.rows)
    return result


def add_speedups(rows: Sequence[BenchRow]) -> None:
    """``speedup_vs_pytorch`` on every measured row whose corner has a PyTorch row."""
    baseline = {(r.profile, r.corner): r.p50_ms for r in rows
                if r.runtime == PYTORCH and r.status == "ok"}
    for r in rows:
        base = baseline.get((r.profile, r.corner))
        if r.status == "ok" and base and r.p50_ms:
            r.speedup_vs_pytorch = base / r.p50_ms


def save_benchmark(out: Path, result: BenchmarkResult | None = None,
                   served: dict[str, Any] | None = None) -> BuildReport:
    """Store runtime rows and/or served results as report.json's ``benchmark`` section; what
    is not measured this time is kept from an earlier bench."""
    report = BuildReport.load(out / REPORT)
    section: dict[str, Any] = dict(report.benchmark or {})
    if result is not None:
        section.update({k: v for k, v in result.to_dict().items() if k != "served"})
    if served is not None:
        section["served"] = served
    report.benchmark = section
    report.save(out / REPORT)
    return report
