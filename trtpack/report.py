"""Stage results and the build report, saved as ``OUT/report.json`` (JSON round-trip), with
its records read and checked (``json_values.record_from_json``): the benchmark's rows and
served results among them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, TypedDict

from trtpack.json_values import JsonObject as JsonObject
from trtpack.json_values import JsonValue as JsonValue
from trtpack.json_values import record_from_json, records_from_json
from trtpack.onnx_tools.files import sha256_file

REPORT = "report.json"  # every build folder's report, beside model_repository/

StageStatus = Literal["ok", "failed", "skipped"]


def int8_weight_layers(metrics: Mapping[str, JsonValue]) -> str | None:
    """A CPU model stage's ``"on integer kernels/all"`` count of its weight layers (Conv,
    MatMul, Gemm with a constant weight), from this report's key or an older report's
    ``int8_weight_matmuls`` (which held the same count under a MatMul-only name)."""
    value = metrics.get("int8_weight_layers", metrics.get("int8_weight_matmuls"))
    return value if isinstance(value, str) else None


def shown_metric(value: float, threshold: float | None = None, digits: int = 4) -> str:
    """``value`` with ``digits`` decimals, or with as many more (up to 12) as it takes to show
    on which side of ``threshold`` it lies: 0.99999987 against 0.9999999 is not "1.0000"."""
    text = f"{value:.{digits}f}"
    if threshold is None or value != value:  # NaN
        return text
    below = value < threshold
    for more in range(digits, 13):
        text = f"{value:.{more}f}"
        if (float(text) < threshold) == below:
            return text
    return repr(value)


@dataclass
class Artifact:
    name: str
    path: str
    size: int
    sha256: str

    @classmethod
    def of(cls, name: str, path: Path, root: Path | None = None) -> Artifact:
        shown = path.relative_to(root) if root is not None and path.is_relative_to(root) else path
        return cls(name, str(shown), path.stat().st_size, sha256_file(path))


@dataclass
class VerificationRow:
    """One output compared at one shape: the numbers and whether the gate passed."""

    check: str  # e.g. "onnx-vs-torch", "fp16-vs-fp32"
    profile: int
    corner: str  # min / opt / max
    shapes: str
    output: str
    max_abs_diff: float
    max_rel_diff: float
    metric: str  # cosine / pooled_cosine / top1 / none
    metric_value: float | None
    passed: bool
    reason: str = ""
    # per-sample gates: metric_value is the worst sample's value, metric_mean the mean over
    # the case's samples, worst_sample its index in the case and worst_text its text (trimmed)
    metric_mean: float | None = None
    samples: int | None = None
    worst_sample: int | None = None
    worst_text: str | None = None
    threshold: float | None = None  # the gate's lowest passing metric value (None: not gated)

    def metric_text(self) -> str:
        """``cosine 0.99999987 < 0.9999999`` for a failed gate (the threshold beside it and
        the digits that show the failure), ``cosine 0.9998`` for a passed one."""
        if self.metric_value is None:
            return ""
        shown = shown_metric(self.metric_value, self.threshold, digits=6)
        if self.threshold is not None and self.metric_value < self.threshold:
            return f"{self.metric} {shown} < {self.threshold}"
        return f"{self.metric} {shown}"


@dataclass
class StageResult:
    name: str
    status: StageStatus
    seconds: float = 0.0
    peak_memory_mb: float | None = None
    cached: bool = False
    # a stage reused from the cache: the seconds it took when it ran (``seconds`` is the reuse)
    ran_seconds: float | None = None
    message: str = ""
    artifacts: list[Artifact] = field(default_factory=list)
    metrics: JsonObject = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    log_path: str | None = None


class MachineInfo(TypedDict):
    """The machine a benchmark ran on (report.json's ``benchmark.machine``)."""

    cpu: str
    logical_cores: int | None
    physical_cores: int | None
    memory_gb: float
    gpu: str | None
    gpu_driver: str | None
    load_average: list[float]
    python: str
    platform: str


@dataclass
class BenchRow:
    """One runtime timed at one profile corner (``trtpack bench``). Latencies in milliseconds
    per request (a request is one batch of the corner's shape); throughput in samples per
    second."""

    runtime: str  # served / onnx-fp32 / cpu-fp32 / pytorch / triton
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
    rounds: int = 0  # turns in rotation with the other runtimes (SLICES)
    spread: float | None = None  # (max - min) / median of the rounds' medians
    unreliable: str = ""  # why this row's timing is not to be trusted ("" when it is)
    speedup_unreliable: str = ""  # why speedup_vs_pytorch is not ("" when it is)


@dataclass
class BenchmarkResult:
    """The runtimes' part of report.json's ``benchmark`` section."""

    seconds_per_row: float
    threads: int
    device: str  # cpu / cuda
    machine: MachineInfo
    rows: list[BenchRow] = field(default_factory=list)
    measured_at: str = ""
    notes: list[str] = field(default_factory=list)
    thread_policy: str = ""  # the same for every row: how the runtimes' threads wait

    def to_dict(self) -> JsonObject:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object, where: str = "benchmark") -> BenchmarkResult:
        """Read and checked (``record_from_json``), its rows too."""
        result = record_from_json(cls, data, where)
        result.rows = records_from_json(BenchRow, result.rows, f"{where}.rows")
        return result


@dataclass
class ServedRow:
    """perf_analyzer at one concurrency: client-side throughput and latency percentiles."""

    model: str
    backend: str  # what the server says runs the model (onnxruntime, tensorrt, python …)
    batching: str  # "dynamic" (as configured) / "none" (variant) / "unbatched model"
    profile: int | None
    corner: str
    batch: int
    concurrency: int
    throughput: float  # inferences (samples) per second
    p50_ms: float
    p90_ms: float
    p99_ms: float
    server_queue_ms: float  # time requests waited in the server's queue (batching)
    server_infer_ms: float  # the model's compute per execution
    window_ms: int = 0  # perf_analyzer's window for this row (longer than asked where retried)


@dataclass
class ServedResult:
    """Throughput through a running Triton: report.json's ``benchmark.served``."""

    url: str  # host:port
    rows: list[ServedRow] = field(default_factory=list)
    tool: str = "perf_analyzer"
    perf_analyzer: str | None = None  # its version (or the binary's name)
    window_ms: int = 0
    concurrency: list[int] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: object, where: str = "benchmark.served") -> ServedResult:
        """Read and checked (``record_from_json``), its rows too."""
        result = record_from_json(cls, data, where)
        result.rows = records_from_json(ServedRow, result.rows, f"{where}.rows")
        return result


@dataclass
class BuildReport:
    model: str
    precision: str
    target: str
    profiles: list[str]
    out_dir: str
    status: Literal["ok", "failed", "accuracy_failed"] = "ok"
    stages: list[StageResult] = field(default_factory=list)
    verification: list[VerificationRow] = field(default_factory=list)
    versions: dict[str, str | None] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    total_seconds: float = 0.0
    peak_memory_mb: float | None = None
    error: str | None = None
    # trtpack bench: the runtimes' rows (``benchmark_result``) and served throughput
    # (``served_result``), kept as written so that a bench of one keeps the other's
    benchmark: JsonObject | None = None

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.name == name), None)

    def name_served_precision(self, cpu_model_served: bool) -> None:
        """``precision`` (the report's title) becomes what the CPU model stage serves: under
        ``--precision auto`` the candidate it chose (its metrics' ``auto.winner``), not the
        one the precision stages built; where the CPU model is what is served
        (``cpu_model_served``: a CPU target, told by the runner, which holds the target),
        ``fp32`` where it declined a convolutional model's INT8 candidate
        (``int8_fp32_reason``)."""
        stage = self.stage("cpu_model")
        auto = stage.metrics.get("auto") if stage is not None else None
        if isinstance(auto, dict) and isinstance(auto.get("winner"), str):
            self.precision = auto["winner"]
        elif stage is not None and cpu_model_served and stage.metrics.get("int8_fp32_reason"):
            self.precision = "fp32"  # the INT8 candidate was declined: FP32 is served

    def benchmark_result(self) -> BenchmarkResult | None:
        """The runtimes ``trtpack bench`` timed (``benchmark``), checked; None where none
        were (never benched, or only through Triton)."""
        if not self.benchmark or "rows" not in self.benchmark:
            return None
        return BenchmarkResult.from_json(self.benchmark)

    def served_result(self) -> ServedResult | None:
        """What ``trtpack bench --served`` measured through Triton, checked; None where
        nothing was."""
        served = (self.benchmark or {}).get("served")
        return ServedResult.from_json(served) if served else None

    def to_dict(self) -> JsonObject:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def save(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def from_dict(cls, data: object) -> BuildReport:
        """The report in ``data`` (parsed report.json), its records checked
        (``record_from_json``): a ``ValueError`` names a malformed field."""
        report = record_from_json(cls, data, "report")
        report.stages = [stage_from_json(s, f"stages[{i}]") for i, s in enumerate(report.stages)]
        report.verification = records_from_json(VerificationRow, report.verification,
                                                "verification")
        report.benchmark_result(), report.served_result()  # checked here, read where shown
        return report

    @classmethod
    def load(cls, path: Path) -> BuildReport:
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))


def stage_from_json(data: object, where: str) -> StageResult:
    """A stage's result as report.json (or a cache entry) records it, checked."""
    stage = record_from_json(StageResult, data, where)
    stage.artifacts = records_from_json(Artifact, stage.artifacts, f"{where}.artifacts")
    return stage
